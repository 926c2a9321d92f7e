"""Cross-entropy, the baseline every other objective is measured against."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from finetune_cli.objectives.base import Objective, check_range
from finetune_cli.objectives.registry import register


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Mean cross-entropy; with smoothing ε the target is (1−ε)·onehot + ε/C."""
    return F.cross_entropy(logits.float(), labels, label_smoothing=label_smoothing)


@register("ce")
class CrossEntropy(Objective):
    r"""Cross-entropy on the classifier's logits.

    .. math:: L = -\frac{1}{N}\sum_i \sum_c q_{ic} \log \mathrm{softmax}(f(x_i))_c,
              \quad q_i = (1-\varepsilon)\,\mathrm{onehot}(y_i) + \varepsilon / C

    Paper: label smoothing from Szegedy et al., "Rethinking the Inception Architecture",
    CVPR 2016 (arXiv 1512.00567).

    Args:
        label_smoothing: ε in [0, 1). Default 0 (plain cross-entropy).

    Inputs: ``text`` (and optional ``text_pair``) with a class ``label``. With
    ``model.problem_type: regression`` a float score and the MSE of the single output; with
    ``multi_label_classification`` a set of labels and binary cross-entropy with logits per label
    (transformers' losses for those problem types; ``label_smoothing`` applies to CE only).

    Relations: ``scl``, ``core_tuning``, ``r3f``/``r4f`` add a term to this loss; ``focal`` with
    γ=0 and no α equals it exactly.
    """

    parts = ("ce",)
    problem_types = ("single_label_classification", "regression", "multi_label_classification")

    def __init__(self, label_smoothing: float = 0.0):
        super().__init__()
        check_range("label_smoothing", label_smoothing, ge=0.0, lt=1.0)
        self.label_smoothing = label_smoothing

    @classmethod
    def describe(cls, problem_type=None):
        """Regression and multi-label train transformers' losses for them, not cross-entropy."""
        loss = {"regression": "Mean squared error of the single output (regression).",
                "multi_label_classification": "Binary cross-entropy with logits, per label (multi-label)."}
        if problem_type in loss:
            return {"loss": loss[problem_type], "paper": None, "arxiv": None, "unused": ("label_smoothing",)}
        return super().describe(problem_type)

    def forward(self, model, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        out = model(batch["features"][0])
        loss = task_loss(out.logits, batch["labels"], self.label_smoothing)
        return {"loss": loss, "ce": loss.detach()}


def task_loss(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """The loss transformers' ``*ForSequenceClassification`` computes for the problem type the labels
    carry: class ids -> cross-entropy; float scores (N,) -> MSE of the single output
    (``regression``); float multi-hot rows (N, C) -> BCE with logits (``multi_label_classification``)."""
    if not labels.is_floating_point():
        return cross_entropy(logits, labels, label_smoothing)
    if labels.dim() == 1:
        return F.mse_loss(logits.float().view(-1), labels.float())
    return F.binary_cross_entropy_with_logits(logits.float(), labels.float())
