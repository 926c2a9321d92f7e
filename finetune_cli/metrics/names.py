"""What evaluating during training reports, by kind of evaluation (``train.metric`` is one of
these). A light module: the recipe check reads it without importing scikit-learn."""

from __future__ import annotations

from typing import Optional

METRIC_NAMES: dict[str, tuple[str, ...]] = {
    "class": ("accuracy", "f1_macro", "mcc"),
    "float": ("pearson", "spearman"),
    "multi": ("f1_micro", "f1_macro", "subset_accuracy"),
    "similarity": ("spearman", "pearson"),
}


def metric_names(kind: Optional[str]) -> tuple[str, ...]:
    """Metric names for ``kind`` (``class``, ``float`` = regression, ``multi`` = multi-label,
    ``similarity``); () when nothing is evaluated."""
    return METRIC_NAMES.get(kind or "", ())
