"""Evaluation functions the trainer calls during training (``evaluate(model) -> {metric: value}``),
and the metrics of a model's outputs by label type."""

from __future__ import annotations

import dataclasses
from typing import Optional

from finetune_cli.data.encode import EncodedData
from finetune_cli.engine.inference import forward_all
from finetune_cli.metrics.tasks import sigmoid, task_metrics, tuned_thresholds

TEXT_COLUMNS = ("text", "text_pair")


def make_classifier_eval(data: EncodedData, label_type: Optional[str], batch_size: int, pad_id: int,
                         threshold: float = 0.5):
    """``evaluate(model)`` for objectives with a classifier head (``metrics.tasks`` by label type;
    ``threshold``: multi-label decisions).

    Multi-label: the metrics are those of ``threshold`` (what training compares from one evaluation
    to the next), and each label's threshold is then tuned on these same outputs
    (``metrics.tasks.tuned_thresholds``: the highest F1 of that label) and set on the model's
    spec, so the folder saved next (``best/`` right after this evaluation, a checkpoint, ``final/``
    after the last one) carries the thresholds of its own weights in ``finetune_model.json``."""

    def evaluate(model) -> dict[str, float]:
        logits = forward_all(model, data, batch_size, pad_id)["logits"]
        metrics = task_metrics(label_type, logits, data.labels, threshold)
        if label_type == "multi" and hasattr(model, "spec"):
            tuned = tuned_thresholds(data.labels, sigmoid(logits), threshold)
            model.spec = dataclasses.replace(model.spec, thresholds=tuple(float(t) for t in tuned))
        return metrics

    return evaluate


def make_similarity_eval(enc: EncodedData, batch_size: int, pad_id: int):
    """``evaluate(model)``: Spearman/Pearson of embedding cosines against the gold scores (``enc``:
    the pairs' two texts as two views, the gold score as label)."""
    from finetune_cli.metrics.similarity import correlations, cosine_scores

    def evaluate(model) -> dict[str, float]:
        a = forward_all(model, enc, batch_size, pad_id, view=0, want=("embeddings",))["embeddings"]
        b = forward_all(model, enc, batch_size, pad_id, view=1, want=("embeddings",))["embeddings"]
        return correlations(cosine_scores(a, b), enc.labels)

    return evaluate
