"""Contrast-regularised tuning (Core-tuning, Zhang et al.), ported from vision to text encoders."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from finetune_cli.objectives._dist import gather_no_grad, gather_with_grad, is_left_out, own_rows
from finetune_cli.objectives.base import Objective, check_range
from finetune_cli.objectives.registry import register
from finetune_cli.objectives.scl import contrastive_log_probs, masked_mean

MIXED_POSITIVES = ("dominant", "exact")


def focal_contrastive_loss(z: torch.Tensor, labels: torch.Tensor, tau: float, gamma: float = 1.0) -> torch.Tensor:
    r"""Focal supervised contrastive loss: positive pairs re-weighted by ``(1 − p)^γ``.

    .. math:: p_{ij} = \frac{\exp(z_i\cdot z_j/\tau)}{\sum_{k\ne i}\exp(z_i\cdot z_k/\tau)},\qquad
              L = \frac{1}{|A|}\sum_{i\in A}\frac{-1}{|P_i|}\sum_{j\in P_i}(1-p_{ij})^{\gamma}\log p_{ij}

    ``P_i`` = the other rows with the same label, ``A`` = anchors with ``P_i`` non-empty. The focal
    weight is not detached (as in the reference code). γ = 0 is the supervised contrastive loss
    of :func:`finetune_cli.objectives.scl.supervised_contrastive_loss`.

    Args:
        z: ``(N, d)`` embeddings (the caller normalises them).
        labels: ``(N,)`` integer ids; rows with the same id are positives.
        tau: temperature > 0.
        gamma: focusing exponent >= 0.
    """
    sim, log_prob, pos = contrastive_log_probs(z, labels, tau)
    n_pos = pos.sum(1)
    has_pos = n_pos > 0
    # p_ii is not a probability of the softmax over k != i; mask before the power so that no
    # (1 - p)^γ of a masked entry can be NaN (p can exceed 1 only on the diagonal).
    lp = log_prob.masked_fill(~pos, 0.0)
    weight = (1.0 - lp.exp()).clamp(min=0.0).pow(gamma) if gamma != 0 else torch.ones_like(lp)
    per_anchor = -(weight * lp).sum(1) / n_pos.clamp(min=1)
    return masked_mean(per_anchor, has_pos)


def hard_pair_indices(f: torch.Tensor, labels: torch.Tensor, anchors: torch.Tensor,
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """For each anchor row: its least similar positive and its most similar negative (cosine).

    ``f`` is the whole (gathered) batch, ``anchors`` the row indices to mine for. An anchor with
    no positive uses itself, one with no negative uses itself (the reference code falls back to
    the anchor likewise when its argmin finds nothing).
    """
    fn = F.normalize(f.detach().float(), dim=-1)
    sim = fn[anchors] @ fn.T
    same = labels[anchors].view(-1, 1) == labels.view(1, -1)
    not_self = torch.ones_like(same)
    not_self[torch.arange(len(anchors), device=f.device), anchors] = False
    pos, neg = same & not_self, ~same
    hard_pos = sim.masked_fill(~pos, float("inf")).argmin(1)
    hard_neg = sim.masked_fill(~neg, float("-inf")).argmax(1)
    hard_pos = torch.where(pos.any(1), hard_pos, anchors)
    hard_neg = torch.where(neg.any(1), hard_neg, anchors)
    return hard_pos, hard_neg


def random_negative_indices(labels: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """A uniformly drawn row of another class for each anchor (any other row when none exists)."""
    u = torch.rand(len(anchors), len(labels), device=labels.device)
    neg = labels[anchors].view(-1, 1) != labels.view(1, -1)
    other = torch.ones_like(neg)
    other[torch.arange(len(anchors), device=labels.device), anchors] = False
    cand = torch.where(neg.any(1, keepdim=True), neg, other)
    # the argmax of uniform scores over the candidates is a uniform draw among them
    return u.masked_fill(~cand, -1.0).argmax(1)


def hardness_directed_mixup(f: torch.Tensor, y: torch.Tensor, labels: torch.Tensor, anchors: torch.Tensor,
                            alpha: float, neg_min_weight: float = 0.8) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The two mixed samples Core-tuning makes per anchor, and their soft labels.

    * semi-hard negative: ``(1−λ)·f_i + λ·f_r``, r a random negative of anchor i,
      λ ~ Beta(α, α) clipped from below at ``neg_min_weight`` (0.8 in the reference code), so the
      sample stays mostly the negative but moves towards the anchor;
    * hard positive: ``λ·f_p + (1−λ)·f_n``, p the least similar positive, n the most similar
      negative of anchor i, λ ~ Beta(α, α) (not clipped, as in the reference code).

    Labels mix with the same λ. Returns ``(2·len(anchors), d)`` features (semi-hard negatives
    first) and ``(2·len(anchors), C)`` soft labels.
    """
    m = len(anchors)
    beta = torch.distributions.Beta(torch.tensor(float(alpha)), torch.tensor(float(alpha)))
    lam_neg = beta.sample((m, 1)).clamp(min=neg_min_weight).to(f.device)
    lam_pos = beta.sample((m, 1)).to(f.device)
    r = random_negative_indices(labels, anchors)
    p, n = hard_pair_indices(f, labels, anchors)
    ln, lp = lam_neg.to(f.dtype), lam_pos.to(f.dtype)
    f_neg = (1 - ln) * f[anchors] + ln * f[r]
    f_pos = lp * f[p] + (1 - lp) * f[n]
    y = y.float()
    y_neg = (1 - lam_neg) * y[anchors] + lam_neg * y[r]
    y_pos = lam_pos * y[p] + (1 - lam_pos) * y[n]
    return torch.cat([f_neg, f_pos]), torch.cat([y_neg, y_pos])


def contrast_labels(y: torch.Tensor, how: str) -> torch.Tensor:
    """Integer ids for rows with soft labels: ``dominant`` = the largest label weight (ties to the
    lower class id); ``exact`` = one id per distinct soft-label vector (the reference code)."""
    if how == "dominant":
        return y.argmax(1)
    return torch.unique(y.detach().float().round(decimals=6), dim=0, return_inverse=True)[1]


def soft_cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean of −Σ_c y_c log softmax(logits)_c."""
    return -(y.float() * F.log_softmax(logits.float(), dim=-1)).sum(-1).mean()


@register("core_tuning")
class CoreTuning(Objective):
    r"""Contrast-regularised fine-tuning: focal contrastive loss on hard mixed pairs, and a
    classifier smoothed by training it on the mixed features with mixed labels.

    .. math:: L = \frac{1}{3B}\sum_{x\in X\cup\tilde X}-\tilde y(x)^\top\log\mathrm{softmax}(W x)
              \;+\;\eta\,L_{con}(g(X\cup\tilde X)),\quad
              L_{con} = \frac{1}{|A|}\sum_{i\in A}\frac{-1}{|P_i|}\sum_{j\in P_i}(1-p_{ij})^{\gamma}\log p_{ij}

    ``X`` = the B pooled sentence embeddings of the batch, ``X̃`` = 2B mixed ones (per anchor a
    semi-hard negative and a hard positive, see :func:`hardness_directed_mixup`), ``ỹ`` one-hot or
    mixed soft labels, ``W`` the classifier, ``g`` the projection head followed by L2
    normalisation, ``p_ij`` the softmax of ``g_i·g_j/τ`` over k ≠ i. Mining, mixing and the
    contrastive term see the batch gathered across processes (with gradients).

    Port from vision: features are the classifier's input (ResNet-50's pooled 2048-d vector in
    the paper): with the native head (``model.head: native``) the first-token state, which the
    whole head (BERT's pooler or RoBERTa's dense+tanh, then the linear map) classifies; with
    ``model.head: pooled`` the ``model.pooling`` embedding. The contrastive head is the model's projection head (Linear→tanh, hidden size)
    where the reference uses Linear→ReLU→Linear(256); the classifier keeps its bias.

    Paper: Zhang, Hooi, Hu, Liang, Feng, "Unleashing the Power of Contrastive Self-Supervised
    Visual Models via Contrast-Regularized Fine-Tuning", NeurIPS 2021 (arXiv 2102.06605);
    reference code github.com/Vanint/Core-tuning (``Core-tuning.py``).

    Args:
        eta: η >= 0, weight of the contrastive term. Default 0.1: the value of the reference
            README's training command (the run behind its CIFAR-10 results); its argparse default
            is 10, which was never the documented setting. η = 0 is a mixup-smoothed CE.
        alpha: α > 0 of Beta(α, α) for the mixing weights. Default 1 (README and argparse).
        tau: temperature > 0. Default 0.07 (hard-coded in the reference's ``focal_SupConLoss``).
        gamma: focal exponent >= 0. Default 1 (the reference's weight is ``1 − p``; γ = 0 is SupCon).
        neg_min_weight: lower clip of the semi-hard negative's mixing weight, in [0, 1]. Default
            0.8 (reference code).
        mixed_positives: which rows count as positives of a mixed row in the contrastive term.
            ``dominant`` (default): rows whose dominant class is the same, so a hard positive is a
            positive of its anchor's class as the paper describes. ``exact``: rows with the same
            soft-label vector, as the reference's LabelEncoder does (mixed rows are then almost
            never positives of anything and act only as extra negatives).

    Inputs: ``text`` (and optional ``text_pair``) with a class ``label``; at least 2 classes.
    Batches come from the ``class_balanced`` sampler so every anchor has a positive to mine.

    Relations: γ = 0 with no mixed rows and no projection is the contrastive term of ``scl``;
    unlike ``scl`` the CE is not down-weighted (total is CE + η·L_con).

    Differences from the reference code, each deliberate: (1) the original rows keep their
    gradient (the reference builds them from ``features.clone().detach()``, so the encoder never
    got the CE or contrastive gradient of the real rows); (2) hard positives/negatives are
    mined with masked argmin/argmax (the reference's argmin over ``similarity * mask`` picks a
    masked zero whenever positive similarities are positive); (3) the random partner of a
    semi-hard negative is drawn from another class (the reference uses a shuffle and accepts
    that some partners share the class); (4) the per-anchor sum is divided by ``|P_i|``, the
    paper's normalisation, not by the batch size (the reference's ``.mean(1)``), which makes
    L_con larger by about 3B/|P_i| than the reference's — another reason to keep η = 0.1.
    """

    capturable = True
    sampler = "class_balanced"
    needs_projection = True
    parts = ("ce", "con")

    def __init__(self, eta: float = 0.1, alpha: float = 1.0, tau: float = 0.07, gamma: float = 1.0,
                 neg_min_weight: float = 0.8, mixed_positives: str = "dominant"):
        super().__init__()
        check_range("eta", eta, ge=0.0)
        check_range("alpha", alpha, gt=0.0)
        check_range("tau", tau, gt=0.0)
        check_range("gamma", gamma, ge=0.0)
        check_range("neg_min_weight", neg_min_weight, ge=0.0, le=1.0)
        if mixed_positives not in MIXED_POSITIVES:
            raise ValueError(f"mixed_positives must be one of {', '.join(MIXED_POSITIVES)}, got {mixed_positives!r}")
        self.eta, self.alpha, self.tau, self.gamma = eta, alpha, tau, gamma
        self.neg_min_weight, self.mixed_positives = neg_min_weight, mixed_positives

    def forward(self, model, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        out = model(batch["features"][0])
        heads = getattr(model, "module", model)  # the TextModel under a DDP wrapper
        labels = batch["labels"]
        num_labels = heads.num_labels
        # The classifier's input features: the pooled embedding for a pooled head, the first-token
        # state for a native one (its head, pooler/dense included, runs on the mixtures).
        f_local = out.features
        y_local = F.one_hot(labels, num_labels).float()
        # Mine over the global batch: this process mixes for its own anchors, whose rows sit at
        # `offset` in the gathered batch.
        out_ = is_left_out(batch)
        f_all = gather_with_grad(f_local, out_)
        labels_all = gather_no_grad(labels, out_)
        y_all = F.one_hot(labels_all, num_labels).float()
        offset, count = own_rows(len(labels), labels.device, out_)  # count 0: a padding batch, left out
        anchors = torch.arange(offset, offset + count, device=labels.device)
        f_mix, y_mix = hardness_directed_mixup(f_all, y_all, labels_all, anchors, self.alpha, self.neg_min_weight)
        feats = torch.cat([f_local, f_mix])
        y = torch.cat([y_local, y_mix])
        ce = soft_cross_entropy(heads.classify(feats), y)
        g = F.normalize(heads.projection(feats).float(), dim=-1)
        ids = contrast_labels(gather_no_grad(y, out_), self.mixed_positives)
        con = focal_contrastive_loss(gather_with_grad(g, out_), ids, self.tau, self.gamma)
        loss = ce + self.eta * con
        return {"loss": loss, "ce": ce.detach(), "con": con.detach()}

