"""Focal loss: cross-entropy that down-weights examples the model already gets right."""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
import torch.nn.functional as F

from finetune_cli.errors import DataError
from finetune_cli.objectives.base import Objective, check_range
from finetune_cli.objectives.registry import register


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """float32 at least (bf16/fp16 logits under autocast), float64 kept for exact tests."""
    return x if x.dtype == torch.float64 else x.float()


def focal_loss(logits: torch.Tensor, labels: torch.Tensor, gamma: float = 2.0,
               alpha: Optional[torch.Tensor] = None) -> torch.Tensor:
    r"""Mean over the batch of ``−α_t (1 − p_t)^γ log p_t``, ``p_t`` the gold class's probability.

    ``alpha`` is a per-class weight vector (``α_t = alpha[y]``) or None (``α_t = 1``). With γ = 0
    and no α this is the per-example cross-entropy times exactly 1, i.e. ``F.cross_entropy``.
    """
    nll = F.cross_entropy(_upcast(logits), labels, reduction="none")  # −log p_t, stable
    if gamma != 0.0:
        # 1 − p_t as −expm1(−nll): exact for confident examples where 1 − exp(−nll) cancels. The
        # clamp keeps (1 − p_t)^γ differentiable at p_t = 1 for γ < 1 (its derivative is ∞ there).
        one_minus_p = (-torch.expm1(-nll)).clamp(min=torch.finfo(nll.dtype).tiny)
        nll = one_minus_p.pow(gamma) * nll
    if alpha is not None:
        nll = alpha.to(nll)[labels] * nll
    return nll.mean()


@register("focal")
class FocalLoss(Objective):
    r"""Focal loss on the classifier's logits.

    .. math:: L = -\frac{1}{N}\sum_i \alpha_{y_i}\,(1 - p_{i,y_i})^{\gamma}\,\log p_{i,y_i},
              \quad p_i = \mathrm{softmax}(f(x_i))

    Paper: Lin, Goyal, Girshick, He, Dollár, "Focal Loss for Dense Object Detection", ICCV 2017
    (arXiv 1708.02002). The paper's best detector uses γ = 2 with α = 0.25 on the foreground
    class; that α balances object vs background anchors and has no natural meaning for an
    arbitrary "class 1" of a text task, so α is off by default here.

    Args:
        gamma: focusing parameter γ ≥ 0. Default 2.0 (the paper's). γ = 0 is cross-entropy.
        alpha: class weights. None (default): all 1. A number a in [0, 1]: the paper's binary
            form, α_t = a for class 1 and 1 − a for class 0 (two classes only). A list: one
            non-negative weight per class, α_t = alpha[y] (as in the Dice-loss authors' code).

    Inputs: ``text`` (and optional ``text_pair``) with a class ``label``.

    Relations: with γ = 0 and no α equals ``ce`` exactly; ``dice`` is the other imbalance-aware
    objective.
    """

    capturable = True
    parts = ("focal",)

    def __init__(self, gamma: float = 2.0, alpha: Optional[Union[float, list[float]]] = None):
        super().__init__()
        check_range("gamma", gamma, ge=0.0)
        weights: Optional[list[float]] = None
        if isinstance(alpha, (int, float)) and not isinstance(alpha, bool):
            check_range("alpha", float(alpha), ge=0.0, le=1.0)
            weights = [1.0 - float(alpha), float(alpha)]
        elif alpha is not None:
            weights = [float(a) for a in alpha]
            if not weights:
                raise ValueError("alpha must be a number, a non-empty list of class weights, or null")
            for a in weights:
                check_range("alpha[c]", a, ge=0.0)
        self.gamma = gamma
        self.register_buffer("alpha", torch.tensor(weights) if weights is not None else None, persistent=False)

    def forward(self, model, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        logits = model(batch["features"][0]).logits
        if self.alpha is not None and self.alpha.numel() != logits.shape[-1]:
            raise DataError(f"objective.alpha of `focal` has {self.alpha.numel()} class weights but the data "
                            f"has {logits.shape[-1]} classes")
        loss = focal_loss(logits, batch["labels"], self.gamma, self.alpha)
        return {"loss": loss, "focal": loss.detach()}
