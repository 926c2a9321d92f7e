"""SimCSE: contrastive sentence embeddings, unsupervised (dropout as augmentation) and supervised
(NLI triplets with hard negatives)."""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.nn.functional as F

from finetune_cli.objectives._dist import gather_no_grad, gather_with_grad, is_left_out
from finetune_cli.objectives.base import Objective, check_range, repeat_rows
from finetune_cli.objectives.registry import register

_P = 1_000_003


def text_keys(features: dict[str, torch.Tensor]) -> torch.Tensor:
    """One int64 key per row, equal for rows with equal token ids (padding ignored): the identity
    of a text inside a batch, used to mask duplicates. A polynomial hash; a collision only masks
    one extra negative."""
    ids = features["input_ids"].long() * features["attention_mask"].long()
    pw = torch.ones(ids.shape[1], dtype=torch.long, device=ids.device)
    if ids.shape[1] > 1:
        pw[1:] = _P
        pw = torch.cumprod(pw, 0) % (2**31 - 1)
    return ((ids + 1) * pw).sum(1) % (2**61 - 1) * 31 + features["attention_mask"].sum(1)


def simcse_loss(z1: torch.Tensor, z2: torch.Tensor, tau: float = 0.05, hard: Optional[torch.Tensor] = None,
                hard_weight: float = 0.0, mask: Optional[torch.Tensor] = None,
                hard_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    r"""In-batch InfoNCE on cosine similarities.

    .. math:: \ell_i = -\log \frac{e^{\cos(z_i, z_i^+)/\tau}}
              {\sum_j e^{\cos(z_i, z_j^+)/\tau} + \sum_j e^{\cos(z_i, z_j^-)/\tau + w\,[i=j]}}

    Args:
        z1: (N, d) anchors. z2: (N, d) positives (row i is anchor i's positive).
        tau: temperature. hard: optional (N, d) hard negatives (row i belongs to anchor i).
        hard_weight: w, added to the logit of each anchor's *own* hard negative (the reference
            implementation's ``hard_negative_weight``; 0 = plain).
        mask / hard_mask: optional (N, N) bool, True = drop that candidate from the denominator
            (duplicates acting as false negatives). The diagonal of ``mask`` must be False.
    Returns: the mean over anchors.
    """
    a = F.normalize(z1.float(), dim=-1)
    logits = a @ F.normalize(z2.float(), dim=-1).T / tau
    if mask is not None:
        logits = logits.masked_fill(mask, float("-inf"))
    if hard is not None:
        lh = a @ F.normalize(hard.float(), dim=-1).T / tau
        if hard_weight:
            lh = lh + hard_weight * torch.eye(len(lh), device=lh.device, dtype=lh.dtype)
        if hard_mask is not None:
            lh = lh.masked_fill(hard_mask, float("-inf"))
        logits = torch.cat([logits, lh], dim=1)
    target = torch.arange(len(a), device=a.device)
    return F.cross_entropy(logits, target)


def duplicate_masks(k_anchor: torch.Tensor, k_pos: torch.Tensor, k_hard: Optional[torch.Tensor] = None):
    """False-negative masks from text keys: candidate positive j ≠ i is dropped for anchor i when
    its text (or its anchor's text) equals i's; a hard negative j is dropped when it equals i's
    positive text."""
    eye = torch.eye(len(k_anchor), dtype=torch.bool, device=k_anchor.device)
    mask = ((k_pos[:, None] == k_pos[None, :]) | (k_anchor[:, None] == k_anchor[None, :])) & ~eye
    hard_mask = None if k_hard is None else (k_pos[:, None] == k_hard[None, :])
    return mask, hard_mask


def _vec(out) -> torch.Tensor:
    # The projection MLP, when the model has one (cls pooling + model.projection=true), is used
    # for the loss only; saved models embed with the pooled vector, as the reference does.
    return out.projection if out.projection is not None else out.embeddings


@register("simcse_unsup")
class SimCSEUnsup(Objective):
    r"""Unsupervised SimCSE: a sentence is its own positive under a different dropout mask.

    .. math:: \ell_i = -\log \frac{e^{\cos(h_i, h_i')/\tau}}{\sum_{j=1}^{N} e^{\cos(h_i, h_j')/\tau}}

    where h and h' come from *one* encoder pass over the batch stacked twice (2N rows, each row
    with its own dropout mask). Embeddings are gathered from every process with gradients.

    Paper: Gao, Yao, Chen, "SimCSE: Simple Contrastive Learning of Sentence Embeddings",
    EMNLP 2021 (arXiv 2104.08821).

    Args:
        tau: temperature τ. Default 0.05 (paper).
        mask_duplicates: drop in-batch copies of the same text from the denominator. Default True.

    Inputs: ``text`` only (unlabeled).

    Relations: ``simcse_sup`` uses a second sentence as the positive and adds hard negatives;
    equals sentence-transformers' ``MultipleNegativesRankingLoss`` on (s, s) pairs with scale 1/τ.
    """

    capturable = True
    required_columns = ("text",)
    label_type = None
    min_classes = 1
    needs_classifier = False
    sampler = "random"
    encoding = "separate"
    evaluation = "similarity"
    parts = ()

    def __init__(self, tau: float = 0.05, mask_duplicates: bool = True):
        super().__init__()
        check_range("tau", tau, gt=0.0)
        self.tau, self.mask_duplicates = tau, mask_duplicates

    def forward(self, model, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        f = batch["features"][0]
        n = f["input_ids"].shape[0]
        z = _vec(model(repeat_rows(f, 2)))
        out_ = is_left_out(batch)
        z1, z2 = gather_with_grad(z[:n], out_), gather_with_grad(z[n:], out_)
        mask = None
        if self.mask_duplicates:
            k = gather_no_grad(text_keys(f), out_)
            mask, _ = duplicate_masks(k, k)
        return {"loss": simcse_loss(z1, z2, self.tau, mask=mask)}


@register("simcse_sup")
class SimCSESup(Objective):
    r"""Supervised SimCSE: (anchor, positive, hard negative) triplets, e.g. NLI (premise,
    entailment, contradiction); every positive and hard negative in the batch is a candidate.

    .. math:: \ell_i = -\log \frac{e^{\cos(h_i, h_i^+)/\tau}}
              {\sum_{j} e^{\cos(h_i, h_j^+)/\tau} + \sum_j e^{\cos(h_i, h_j^-)/\tau + w[i=j]}}

    Paper: Gao, Yao, Chen, "SimCSE", EMNLP 2021 (arXiv 2104.08821), §4.

    Args:
        tau: temperature τ. Default 0.05 (paper).
        hard_neg_weight: w added to the logit of an anchor's own hard negative. Default 0 (paper;
            its appendix tries w>0 for no gain).
        mask_duplicates: drop duplicate texts (e.g. the same premise's other entailment) from the
            denominator. Default True.

    Inputs: ``text`` (anchor), ``text_pair`` (positive), ``hard_neg`` (column map
    ``data.columns.hard_neg``; a csv with ``sent0,sent1,hard_neg`` maps onto them).
    ``data.nli_triplets: true`` builds them from (premise, hypothesis, label) NLI rows.

    Relations: ``simcse_unsup`` with a real positive instead of a dropout copy; sentence-transformers'
    ``MultipleNegativesRankingLoss`` on (anchor, positive, negative) triplets.
    """

    capturable = True
    required_columns = ("text", "text_pair", "hard_neg")
    label_type = None
    min_classes = 1
    needs_classifier = False
    sampler = "random"
    encoding = "separate"
    evaluation = "similarity"
    parts = ()

    def __init__(self, tau: float = 0.05, hard_neg_weight: float = 0.0, mask_duplicates: bool = True):
        super().__init__()
        check_range("tau", tau, gt=0.0)
        if not math.isfinite(hard_neg_weight):
            raise ValueError(f"hard_neg_weight must be finite, got {hard_neg_weight}")
        self.tau, self.hard_neg_weight, self.mask_duplicates = tau, hard_neg_weight, mask_duplicates

    def forward(self, model, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        feats = batch["features"]
        out_ = is_left_out(batch)
        zs = [gather_with_grad(_vec(model(f)), out_) for f in feats]
        hard = zs[2] if len(zs) > 2 else None
        mask = hard_mask = None
        if self.mask_duplicates:
            keys = [gather_no_grad(text_keys(f), out_) for f in feats]
            mask, hard_mask = duplicate_masks(keys[0], keys[1], keys[2] if len(keys) > 2 else None)
        return {"loss": simcse_loss(zs[0], zs[1], self.tau, hard, self.hard_neg_weight, mask, hard_mask)}
