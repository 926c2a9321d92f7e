"""Which metrics a gate (``--expect``) can name, known before anything trains or loads."""

from __future__ import annotations

from finetune_cli.pipelines.common import objective_class
from finetune_cli.recipe import Recipe

# What each evaluation kind (``Objective.evaluation``) reports during training.
TRAIN_EVAL_METRICS = {"classifier": ("accuracy", "f1_macro", "mcc"), "similarity": ("pearson", "spearman")}
# ``finetune eval`` adds calibration to classification.
EVAL_EXTRA = {"classifier": ("ece", "mce", "nll")}


def train_metrics(recipe: Recipe) -> tuple[str, ...]:
    """Metrics of the final evaluation of ``finetune train`` with this recipe."""
    return TRAIN_EVAL_METRICS.get(objective_class(recipe).evaluation, ())


def eval_metrics(recipe: Recipe) -> tuple[str, ...]:
    kind = objective_class(recipe).evaluation
    return TRAIN_EVAL_METRICS.get(kind, ()) + EVAL_EXTRA.get(kind, ())
