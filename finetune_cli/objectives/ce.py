"""Cross-entropy, the baseline every other objective is measured against."""

from __future__ import annotations

from typing import Any, Optional, Union

import numpy as np
import torch
import torch.nn.functional as F

from finetune_cli.errors import RecipeError
from finetune_cli.objectives.base import Objective, check_range
from finetune_cli.objectives.registry import register


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0,
                  weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Mean cross-entropy; with smoothing ε the target is (1−ε)·onehot + ε/C; with class weights
    w the weighted mean Σ w_{y_i} l_i / Σ w_{y_i} (torch's ``weight``)."""
    return F.cross_entropy(logits.float(), labels, weight=weight, label_smoothing=label_smoothing)


def balanced_weights(labels: np.ndarray, num_labels: int) -> list[float]:
    """scikit-learn's ``class_weight="balanced"``: n_samples / (n_classes * count_c); a class with no
    training row gets 0 (it cannot be weighted up from nothing)."""
    counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=num_labels)
    return [float(len(labels) / (num_labels * c)) if c else 0.0 for c in counts]


@register("ce")
class CrossEntropy(Objective):
    r"""Cross-entropy on the classifier's logits.

    .. math:: L = -\frac{1}{N}\sum_i \sum_c q_{ic} \log \mathrm{softmax}(f(x_i))_c,
              \quad q_i = (1-\varepsilon)\,\mathrm{onehot}(y_i) + \varepsilon / C

    Paper: label smoothing from Szegedy et al., "Rethinking the Inception Architecture",
    CVPR 2016 (arXiv 1512.00567).

    With class weights :math:`w` (``class_weights``) each example counts :math:`w_{y_i}` times and
    the mean is :math:`\sum_i w_{y_i} l_i / \sum_i w_{y_i}` (torch's ``cross_entropy(weight=w)``).

    Args:
        label_smoothing: ε in [0, 1). Default 0 (plain cross-entropy).
        class_weights: ``balanced`` (scikit-learn's n_samples / (n_classes · count_c), from the
            training labels) or one non-negative weight per label, in label-id order; single-label
            classification only. Default None (every class 1).

    Inputs: ``text`` (and optional ``text_pair``) with a class ``label``. With
    ``model.problem_type: regression`` a float score and the MSE of the single output; with
    ``multi_label_classification`` a set of labels and binary cross-entropy with logits per label
    (transformers' losses for those problem types; ``label_smoothing`` applies to CE only).

    Relations: ``scl``, ``core_tuning``, ``r3f``/``r4f`` add a term to this loss; ``focal`` with
    γ=0 and no α equals it exactly.
    """

    capturable = True
    parts = ("ce",)
    problem_types = ("single_label_classification", "regression", "multi_label_classification")

    def __init__(self, label_smoothing: float = 0.0, class_weights: Optional[Union[str, list[float]]] = None):
        super().__init__()
        check_range("label_smoothing", label_smoothing, ge=0.0, lt=1.0)
        if isinstance(class_weights, str) and class_weights != "balanced":
            raise ValueError(f"class_weights must be `balanced` or a list of weights, got {class_weights!r}")
        if isinstance(class_weights, list):
            if not class_weights:
                raise ValueError("class_weights must be `balanced` or a non-empty list of weights")
            for w in class_weights:
                check_range("class_weights[c]", float(w), ge=0.0)
        self.label_smoothing = label_smoothing
        self.class_weights = class_weights
        self.register_buffer("weight", None, persistent=False)

    def bind_labels(self, labels: Any, num_labels: int) -> None:
        """``class_weights`` made a tensor: ``balanced`` from ``labels``; a list checked against the
        label count."""
        cw = self.class_weights
        if cw is None:
            return
        if labels is None or np.asarray(labels).dtype.kind == "f":
            raise RecipeError("objective.class_weights weights the classes of single-label classification; this "
                              "run is regression or multi-label")
        if cw == "balanced":
            cw = balanced_weights(np.asarray(labels), num_labels)
        elif len(cw) != num_labels:
            raise RecipeError(f"objective.class_weights has {len(cw)} weights but the data has {num_labels} labels "
                              f"(one weight per label, in label-id order)")
        self.weight = torch.tensor([float(w) for w in cw], dtype=torch.float32)

    @classmethod
    def describe(cls, problem_type=None):
        """Regression and multi-label train transformers' losses for them, not cross-entropy."""
        loss = {"regression": "Mean squared error of the single output (regression).",
                "multi_label_classification": "Binary cross-entropy with logits, per label (multi-label)."}
        if problem_type in loss:
            return {"loss": loss[problem_type], "paper": None, "arxiv": None, "unused": ("label_smoothing", "class_weights")}
        return super().describe(problem_type)

    def forward(self, model, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        out = model(batch["features"][0])
        loss = task_loss(out.logits, batch["labels"], self.label_smoothing, self.weight)
        return {"loss": loss, "ce": loss.detach()}


def task_loss(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0,
              weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The loss transformers' ``*ForSequenceClassification`` computes for the problem type the labels
    carry: class ids -> cross-entropy; float scores (N,) -> MSE of the single output
    (``regression``); float multi-hot rows (N, C) -> BCE with logits (``multi_label_classification``)."""
    if not labels.is_floating_point():
        return cross_entropy(logits, labels, label_smoothing, weight)
    if labels.dim() == 1:
        return F.mse_loss(logits.float().view(-1), labels.float())
    return F.binary_cross_entropy_with_logits(logits.float(), labels.float())
