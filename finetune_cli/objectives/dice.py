"""Self-adjusting Dice loss: an F1-like objective whose per-example weight decays for easy examples."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from finetune_cli.objectives.base import Objective, check_range
from finetune_cli.objectives.registry import register


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """float32 at least (bf16/fp16 logits under autocast), float64 kept for exact tests."""
    return x if x.dtype == torch.float64 else x.float()


def self_adjusting_dice_loss(logits: torch.Tensor, labels: torch.Tensor, alpha: float = 0.01,
                             gamma: float = 1.0) -> torch.Tensor:
    r"""Mean over examples of ``Σ_c 1 − (2 q_ic y_ic + γ) / (q_ic + y_ic + γ)``, ``q = (1 − p)^α p``.

    ``p = softmax(logits)`` and ``y`` the one-hot label; each class is scored one-vs-rest and the
    class terms are summed, as in the authors' multi-class code. Every ratio uses only its own
    example's numbers, so an example's loss does not depend on the rest of the batch (the
    reference code sums the denominator over the whole batch instead; see :class:`DiceLoss`).
    """
    p = F.softmax(_upcast(logits), dim=-1)
    y = F.one_hot(labels, num_classes=logits.shape[-1]).to(p.dtype)
    q = p if alpha == 0.0 else (1.0 - p).pow(alpha) * p
    per_class = 1.0 - (2.0 * q * y + gamma) / (q + y + gamma)
    return per_class.sum(-1).mean()


@register("dice")
class DiceLoss(Objective):
    r"""Self-adjusting Dice loss (DSC) on the classifier's softmax.

    .. math:: L = \frac{1}{N}\sum_i \sum_c \Big[1 - \frac{2\,(1-p_{ic})^{\alpha} p_{ic}\, y_{ic} + \gamma}
              {(1-p_{ic})^{\alpha} p_{ic} + y_{ic} + \gamma}\Big]

    Paper: Li, Sun, Meng, Liang, Wu, Li, "Dice Loss for Data-imbalanced NLP Tasks", ACL 2020
    (arXiv 1911.02855), the "DSC" row of its loss table. The paper states the binary case with the
    positive class's probability ``p_i1``; for C classes we follow the authors' code
    (``loss/dice_loss.py``): one-vs-rest per class, class terms summed. The numerator carries the
    Dice coefficient's factor 2 (paper and code), so a confident correct prediction with α = 0
    costs 0. Two deliberate differences from that code: its denominator is summed over the whole
    batch (``flat_input.sum() + flat_target.sum()``), which makes an example's loss depend on the
    batch size and on the other examples — here it is per example, as the paper's equation is;
    and its OHEM option and squared-denominator variant ("DL" in the paper) are not offered.

    Args:
        alpha: self-adjusting exponent α ≥ 0 on (1 − p). Default 0.01, with γ the value the
            authors' GLUE-MRPC script uses (``DICE_ALPHA=0.01``); α = 0 is the plain smoothed Dice.
        gamma: smoothing γ > 0 added to numerator and denominator (lets negatives contribute).
            Default 1.0 (the script's ``DICE_SMOOTH=1``).

    Inputs: ``text`` (and optional ``text_pair``) with a class ``label``.

    Relations: ``focal`` is the other imbalance-aware objective; both replace ``ce``.
    """

    capturable = True
    parts = ("dice",)

    def __init__(self, alpha: float = 0.01, gamma: float = 1.0):
        super().__init__()
        check_range("alpha", alpha, ge=0.0)
        check_range("gamma", gamma, gt=0.0)
        self.alpha, self.gamma = alpha, gamma

    def forward(self, model, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        logits = model(batch["features"][0]).logits
        loss = self_adjusting_dice_loss(logits, batch["labels"], self.alpha, self.gamma)
        return {"loss": loss, "dice": loss.detach()}
