"""Evaluation functions the trainer calls during training (``evaluate(model) -> {metric: value}``),
and the metrics of a model's outputs by label type."""

from __future__ import annotations

from typing import Optional

import numpy as np

from finetune_cli.data.encode import EncodedData, encode_table
from finetune_cli.engine.inference import forward_all
from finetune_cli.errors import DataError
from finetune_cli.metrics import classification_metrics

TEXT_COLUMNS = ("text", "text_pair")


def evaluate_logits(label_type: Optional[str], logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    if label_type == "class":
        return classification_metrics(labels, logits.argmax(-1))
    if label_type == "float":
        from scipy.stats import pearsonr, spearmanr

        pred = logits.reshape(len(logits), -1)[:, 0]
        return {"pearson": float(pearsonr(pred, labels)[0]), "spearman": float(spearmanr(pred, labels)[0])}
    raise DataError("evaluation needs labelled data")


def make_classifier_eval(data: EncodedData, label_type: Optional[str], batch_size: int, pad_id: int):
    """``evaluate(model)`` for objectives with a classifier head."""

    def evaluate(model) -> dict[str, float]:
        logits = forward_all(model, data, batch_size, pad_id)["logits"]
        return evaluate_logits(label_type, logits, data.labels)

    return evaluate


def make_similarity_eval(table, tokenizer, max_length: int, batch_size: int, pad_id: int):
    """``evaluate(model)``: Spearman/Pearson of embedding cosines against the gold scores."""
    from finetune_cli.metrics.similarity import correlations, cosine_scores

    enc = encode_table(table, tokenizer, max_length, TEXT_COLUMNS, joint=False)

    def evaluate(model) -> dict[str, float]:
        a = forward_all(model, enc, batch_size, pad_id, view=0, want=("embeddings",))["embeddings"]
        b = forward_all(model, enc, batch_size, pad_id, view=1, want=("embeddings",))["embeddings"]
        return correlations(cosine_scores(a, b), enc.labels)

    return evaluate
