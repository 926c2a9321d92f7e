"""The one table of metric names: what evaluating a kind of model reports. Recipe validation
(``train.metric``), ``--expect``, ``sweep --metric`` and ``report`` all read it, so a name one of
them accepts is a name the evaluation computes. A light module: no scikit-learn import."""

from __future__ import annotations

from typing import Optional

# What evaluating during training reports, by kind: ``class`` (single-label), ``float``
# (regression), ``multi`` (multi-label), ``similarity`` (embedding cosines vs gold scores).
METRIC_NAMES: dict[str, tuple[str, ...]] = {
    "class": ("accuracy", "f1_macro", "mcc", "f1", "precision", "recall", "roc_auc", "pr_auc"),
    "float": ("pearson", "spearman"),
    "multi": ("f1_micro", "f1_macro", "subset_accuracy"),
    "similarity": ("spearman", "pearson"),
}
# What a run with ``train.refit_head`` adds to each evaluation: the refitted head's training accuracy.
REFIT_METRICS = ("refit_train_accuracy",)
# What ``finetune eval`` adds: calibration of a single-label classifier's probabilities.
CALIBRATION_METRICS = ("ece", "mce", "nll")
# Display order in reports; names not listed follow alphabetically.
METRIC_ORDER = ("accuracy", "f1_macro", "mcc", "f1", "precision", "recall", "roc_auc", "pr_auc", *CALIBRATION_METRICS,
                "pearson", "spearman")


def metric_names(kind: Optional[str]) -> tuple[str, ...]:
    """Metric names for ``kind``; () when nothing is evaluated."""
    return METRIC_NAMES.get(kind or "", ())


def ordered(names: set[str]) -> list[str]:
    return [m for m in METRIC_ORDER if m in names] + sorted(names - set(METRIC_ORDER))


# How the Hub's model-index names each metric (its `evaluate` metric ids): ``(type, args)``. A name
# not listed keeps its own name as type.
HUB_METRIC_TYPES: dict[str, tuple[str, Optional[dict]]] = {
    "accuracy": ("accuracy", None), "subset_accuracy": ("accuracy", {"subset": True}),
    "f1": ("f1", {"average": "binary"}), "f1_macro": ("f1", {"average": "macro"}),
    "f1_micro": ("f1", {"average": "micro"}), "precision": ("precision", {"average": "binary"}),
    "recall": ("recall", {"average": "binary"}), "mcc": ("matthews_correlation", None),
    "roc_auc": ("roc_auc", None), "pr_auc": ("average_precision", None),
    "pearson": ("pearsonr", None), "spearman": ("spearmanr", None),
}


def hub_metric(name: str) -> tuple[str, Optional[dict]]:
    """``(type, args)`` of our metric ``name`` in the Hub's model-index."""
    return HUB_METRIC_TYPES.get(name, (name, None))
