"""Pieces the pipelines share: the objective's data contract applied to a recipe, model heads,
evaluation functions."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from finetune_cli.data import EncodedData, TaskData, encode_table, load_task_data
from finetune_cli.engine.inference import forward_all
from finetune_cli.errors import DataError
from finetune_cli.metrics import classification_metrics
from finetune_cli.models.text_model import HeadSpec
from finetune_cli.objectives import registry
from finetune_cli.recipe import Recipe

TEXT_COLUMNS = ("text", "text_pair")


def objective_class(recipe: Recipe):
    return registry.get(recipe.objective.name)


def text_columns(cls) -> tuple[str, ...]:
    """Text columns in the order the objective encodes them (label and other non-text columns
    excluded)."""
    cols = [c for c in cls.required_columns if c != "label"]
    if cls.encoding == "joint" and "text_pair" not in cols:
        cols.append("text_pair")
    return tuple(cols)


def head_spec(recipe: Recipe, cls, num_labels: int, encoder_dropout: float) -> HeadSpec:
    dropout = recipe.model.classifier_dropout
    return HeadSpec(
        pooling=recipe.model.pooling,
        num_labels=num_labels if cls.needs_classifier else 0,
        classifier_dropout=encoder_dropout if dropout is None else dropout,
        spectral_norm=cls.spectral_norm_head,
        projection=cls.needs_projection,
        problem_type="regression" if cls.label_type == "float" else "single_label_classification",
    )


def load_data(recipe: Recipe, cls, data_dir: Optional[Path], need_train: bool = True,
              need_eval: bool = False) -> TaskData:
    return load_task_data(recipe.data, seed=recipe.train.seed, label_type=cls.label_type,
                          required_columns=tuple(cls.required_columns), data_dir=data_dir,
                          need_train=need_train, need_eval=need_eval, min_classes=cls.min_classes if
                          cls.label_type == "class" else 1)


def encode(recipe: Recipe, cls, table, tokenizer) -> EncodedData:
    return encode_table(table, tokenizer, recipe.model.max_length, text_columns(cls), joint=cls.encoding == "joint")


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


@dataclass
class RunInfo:
    run_dir: Path
    resumed_from: Optional[Path]
    already_complete: bool = False
    summary: Optional[dict[str, Any]] = None
