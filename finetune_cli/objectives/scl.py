"""Cross-entropy plus a supervised contrastive term on the sentence embeddings (Gunel et al.)."""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F

from finetune_cli.objectives._dist import gather_no_grad, gather_with_grad, is_left_out
from finetune_cli.objectives.base import (
    Objective,
    check_range,
    crop_rows,
    repeat_rows,
    sample_crops,
    trim_padding,
)
from finetune_cli.objectives.ce import cross_entropy
from finetune_cli.objectives.registry import register


def contrastive_log_probs(z: torch.Tensor, labels: torch.Tensor, tau: float,
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the supervised contrastive losses (this one and Core-tuning's focal one) share: the
    logits ``z_i·z_j/τ``, ``log p_ij`` (the log-softmax over ``k != i``) and the positives (same
    label, ``j != i``), for ``(N, d)`` embeddings ``z`` and ``(N,)`` integer ``labels``."""
    n = z.shape[0]
    if z.dtype in (torch.float16, torch.bfloat16):
        z = z.float()  # exp(·/τ) needs the range; float64 stays float64 (tests, gradcheck)
    sim = z @ z.T / tau
    self_mask = torch.eye(n, dtype=torch.bool, device=z.device)
    # log-softmax over k != i: the diagonal is excluded by setting it to -inf before logsumexp.
    log_denom = torch.logsumexp(sim.masked_fill(self_mask, float("-inf")), dim=1, keepdim=True)
    log_prob = sim - log_denom
    pos = (labels.view(-1, 1) == labels.view(1, -1)) & ~self_mask
    return sim, log_prob, pos


def supervised_contrastive_loss(z: torch.Tensor, labels: torch.Tensor, tau: float) -> torch.Tensor:
    r"""Supervised contrastive loss over one batch of (already L2-normalised) embeddings.

    .. math:: L = \frac{1}{|A|}\sum_{i\in A} \frac{-1}{N_{y_i}-1} \sum_{j\ne i,\,y_j=y_i}
              \log \frac{\exp(z_i\cdot z_j/\tau)}{\sum_{k\ne i}\exp(z_i\cdot z_k/\tau)}

    ``A`` is the set of anchors with at least one positive (``N_{y_i} >= 2``); anchors without one
    contribute nothing. With no such anchor at all the loss is an exact zero that still belongs to
    the graph (its gradient is zero, never NaN). No value is read on the host and no shape depends
    on the labels (a masked mean, not a selection), so a step with it can be captured.

    Args:
        z: ``(N, d)`` embeddings; the caller normalises them (the function does not, so it can be
            tested on any vectors).
        labels: ``(N,)`` integer class ids.
        tau: temperature, > 0.
    """
    sim, log_prob, pos = contrastive_log_probs(z, labels, tau)
    n_pos = pos.sum(1)
    has_pos = n_pos > 0
    # masked_fill rather than multiply: the diagonal of log_prob is finite here but a 0·(-inf)
    # would be NaN if it were not.
    per_anchor = -log_prob.masked_fill(~pos, 0.0).sum(1) / n_pos.clamp(min=1)
    return masked_mean(per_anchor, has_pos)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of ``values`` where ``mask`` holds; an exact zero (in the graph) where it holds
    nowhere. Computed without reading the mask on the host."""
    return values.masked_fill(~mask, 0.0).sum() / mask.sum().clamp(min=1)


@register("scl")
class SupervisedContrastive(Objective):
    r"""Cross-entropy regularised by a supervised contrastive term on the sentence embeddings.

    .. math:: L = (1-\lambda)\,\mathrm{CE} + \lambda\,L_{SCL},\qquad
              L_{SCL} = \frac{1}{|A|}\sum_{i\in A} \frac{-1}{N_{y_i}-1}\sum_{j\ne i,\,y_j=y_i}
              \log\frac{\exp(\Phi_i\cdot\Phi_j/\tau)}{\sum_{k\ne i}\exp(\Phi_i\cdot\Phi_k/\tau)}

    Φ is the L2-normalised pooled sentence embedding (``model.pooling``; the paper used RoBERTa's
    final-layer [CLS]). The paper writes a sum over the batch; we average over the anchors ``A``
    that have a positive, so the scale does not depend on batch size and a lone anchor never
    yields NaN. Embeddings and labels are gathered across processes with gradients, so under
    ``accelerate launch`` / ``torchrun`` the positives and negatives come from the global batch.

    Paper: Gunel, Du, Conneau, Stoyanov, "Supervised Contrastive Learning for Pre-trained Language
    Model Fine-tuning", ICLR 2021 (arXiv 2011.01403).

    Args:
        tau: temperature τ > 0. Default 0.3 (the paper searches {0.1, 0.3, 0.5, 0.7}; 0.3 is its
            best setting on full data).
        lam: λ in [0, 1], weight of the contrastive term. Default 0.9 (the paper's best on full
            data). λ = 1 trains no classifier (CE weight 0): evaluation would be of an untrained head.
        views: how many times each example is encoded per step, each copy with its own dropout
            masks; every copy is an anchor and a positive of the others of its class (the
            multi-view form of Khosla et al. 2020, eq. 2, with SimCSE's dropout as the
            augmentation), and CE is the mean over all copies. Default 1 = the paper (Gunel et
            al. contrast the batch as it is); ``views: 2`` is a departure, for few-shot data where
            a class's positives are the same few sentences at every step. Costs ``views`` times
            the forward and backward compute.
        crop: with ``views`` >= 2, the copies after the first are cropped: each keeps a random
            contiguous span of ``u·m`` of its ``m`` text tokens, ``u ~ U(crop, 1)`` drawn per row
            and step (the crop augmentation of SimCSE's Table 1 / Wu et al. 2020's CLEAR), so a
            class's positives include shorter parts of its sentences. With ``views: 1`` the one
            copy is cropped, and the batch is cut to its longest crop: the augmentation at a lower
            cost than a plain step instead of twice it. Default 1.0 = no cropping (the paper). A
            departure for few-shot data, where a draw's classes can differ in length and the
            contrastive term would otherwise learn length. Single texts only: a pair is encoded
            whole (cropping is skipped for it, never refused).

    Inputs: ``text`` (and optional ``text_pair``) with a class ``label``; at least 2 classes.
    Batches come from the ``class_balanced`` sampler, so every anchor has a positive in its batch
    (the paper's few-shot setting, 20–100 examples, leaves anchors alone in random batches).

    Relations: λ = 0 is ``ce`` (with ``views`` > 1: CE on dropout-noised copies). ``core_tuning``
    adds a focal weight to the same contrastive term, trains it on mixed hard pairs and puts it on a
    projection head. ``simcse_sup`` contrasts
    entailment pairs instead of classes.
    """

    sampler = "class_balanced"
    parts = ("ce", "scl")
    capturable = True

    def __init__(self, tau: float = 0.3, lam: float = 0.9, views: int = 1, crop: float = 1.0):
        super().__init__()
        check_range("tau", tau, gt=0.0)
        check_range("lam", lam, ge=0.0, le=1.0)
        check_range("views", views, ge=1, le=8)
        check_range("crop", crop, gt=0.0, le=1.0)
        self.tau, self.lam, self.views, self.crop = tau, lam, views, crop

    def capture_refusal(self) -> Optional[str]:
        if self.crop < 1.0:  # each copy keeps a random span: its width comes from the draw
            return f"objective `scl` with crop={self.crop} cuts rows at random lengths (a shape from data)"
        return None

    def forward(self, model, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        f, labels = batch["features"][0], batch["labels"]
        crop = self.crop < 1.0 and not _is_pair(f)
        if self.views == 1 and crop:
            f = trim_padding(crop_rows(f, *sample_crops(f["attention_mask"].sum(1), self.crop)))
        elif self.views > 1:
            extra = repeat_rows(f, self.views - 1)
            if crop:
                extra = crop_rows(extra, *sample_crops(extra["attention_mask"].sum(1), self.crop))
            f, labels = {k: torch.cat([f[k], extra[k]]) for k in f}, labels.repeat(self.views)
        out = model(f)
        ce = cross_entropy(out.logits, labels)
        z = F.normalize(out.embeddings.float(), dim=-1)
        out_ = is_left_out(batch)
        scl = supervised_contrastive_loss(gather_with_grad(z, out_), gather_no_grad(labels, out_), self.tau)
        loss = (1.0 - self.lam) * ce + self.lam * scl
        return {"loss": loss, "ce": ce.detach(), "scl": scl.detach()}


def _is_pair(features: dict[str, torch.Tensor]) -> bool:
    """A joint pair (two segments, or its closing token seen twice): cropping would cut its separator."""
    ids, mask = features["input_ids"], features["attention_mask"].bool()
    last = ids.gather(1, (mask.sum(1) - 1).clamp(min=0).view(-1, 1))
    tt = features.get("token_type_ids")
    return bool(((ids == last) & mask).sum(1).gt(1).any()) or (tt is not None and bool((tt * mask).any()))
