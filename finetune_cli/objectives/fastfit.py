"""FastFit: supervised contrastive training over the texts and their label texts (Yehudai & Bandel)."""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F

from finetune_cli.objectives.base import Objective, check_range, repeat_rows
from finetune_cli.objectives.ce import cross_entropy
from finetune_cli.objectives.registry import register

SIMILARITIES = ("tokens", "pooled")


def max_sim(a: torch.Tensor, a_mask: torch.Tensor, b: torch.Tensor, b_mask: torch.Tensor,
            chunk: int = 1 << 24) -> torch.Tensor:
    r"""Token-level similarity (ColBERT's late interaction), ``(n, m)`` for ``(n, La, d)`` and ``(m, Lb, d)``
    token vectors (already L2-normalised) with ``(n, La)`` / ``(m, Lb)`` masks:

    .. math:: s(a_i, b_j) = \frac{1}{|a_i|}\sum_{t \in a_i} \max_{u \in b_j} a_{i,t}\cdot b_{j,u}

    over the unmasked tokens only. Computed ``chunk`` scores at a time, so the ``n·m·La·Lb`` products
    are never held at once."""
    n, la, _ = a.shape
    m, lb, _ = b.shape
    bm = b_mask.bool()
    am = a_mask.to(a.dtype)
    rows = max(1, chunk // max(1, m * la * lb))
    out = []
    for s in range(0, n, rows):
        prod = torch.einsum("itd,jud->ijtu", a[s:s + rows], b)
        best = prod.masked_fill(~bm[None, :, None, :], float("-inf")).amax(-1)  # (r, m, La)
        best = best.masked_fill(am[s:s + rows, None, :] == 0, 0.0)
        out.append(best.sum(-1) / am[s:s + rows].sum(-1, keepdim=True).clamp(min=1))
    return torch.cat(out)


def text_label_similarity(sim: torch.Tensor, is_label: torch.Tensor) -> torch.Tensor:
    """The reference code's symmetric mode: a label row's similarity to a text row is the text's to
    the label (summed over the text's tokens), so ``S[label, text] = S[text, label]``."""
    swap = is_label.view(-1, 1) & ~is_label.view(1, -1)
    return torch.where(swap, sim.T, sim)


def supcon_from_similarity(sim: torch.Tensor, labels: torch.Tensor, tau: float) -> torch.Tensor:
    r"""Supervised contrastive loss (Khosla et al. 2020, eq. 2) from a similarity matrix:

    .. math:: L = \frac{1}{|A|}\sum_{i \in A} \frac{-1}{|P(i)|}\sum_{p \in P(i)}
              \log\frac{\exp(S_{ip}/\tau)}{\sum_{a \ne i}\exp(S_{ia}/\tau)}

    ``P(i)`` = the other rows of ``i``'s class, ``A`` = the rows with at least one (an exact zero in
    the graph when there is none). Args: ``sim`` ``(N, N)``, ``labels`` ``(N,)`` ints, ``tau`` > 0."""
    n = sim.shape[0]
    if sim.dtype in (torch.float16, torch.bfloat16):
        sim = sim.float()
    logits = sim / tau
    eye = torch.eye(n, dtype=torch.bool, device=sim.device)
    log_prob = logits - torch.logsumexp(logits.masked_fill(eye, float("-inf")), dim=1, keepdim=True)
    pos = (labels.view(-1, 1) == labels.view(1, -1)) & ~eye
    n_pos = pos.sum(1)
    has = n_pos > 0
    if not bool(has.any()):
        return sim.sum() * 0.0
    per_anchor = -log_prob.masked_fill(~pos, 0.0).sum(1) / n_pos.clamp(min=1)
    return per_anchor[has].mean()


def fastfit_similarity(tokens: Optional[torch.Tensor], mask: Optional[torch.Tensor], pooled: torch.Tensor,
                       is_label: torch.Tensor, similarity: str) -> torch.Tensor:
    """``S`` over the rows of a step (texts and label texts): cosine of the pooled embeddings, or
    :func:`max_sim` of the token states with the text-to-label entries made symmetric."""
    if similarity == "pooled":
        z = F.normalize(pooled.float(), dim=-1)
        return z @ z.T
    t = F.normalize(tokens.float(), dim=-1)
    return text_label_similarity(max_sim(t, mask, t, mask), is_label)


def stack_padded(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], pad_id: int) -> dict[str, torch.Tensor]:
    """Two tokenised batches as one (rows of ``a`` then ``b``), the narrower padded (``pad_id``, mask 0)."""
    width = max(a["input_ids"].shape[1], b["input_ids"].shape[1])

    def pad(f: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        extra = width - f["input_ids"].shape[1]
        if not extra:
            return f
        return {k: F.pad(v, (0, extra), value=pad_id if k == "input_ids" else 0) for k, v in f.items()}

    pa, pb = pad(a), pad(b)
    return {k: torch.cat([pa[k], pb[k].to(pa[k].dtype)]) for k in pa if k in pb}


def stack_token_states(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Two passes' ``(token states (n, L, d), mask (n, L))`` as one, the narrower padded with masked zeros."""
    width = max(a[1].shape[1], b[1].shape[1])
    return (torch.cat([F.pad(t, (0, 0, 0, width - t.shape[1])) for t, _ in (a, b)]),
            torch.cat([F.pad(m, (0, width - m.shape[1])) for _, m in (a, b)]))


@register("fastfit")
class FastFit(Objective):
    r"""Supervised contrastive loss over the texts and their label texts, plus a down-weighted CE.

    .. math:: L = L_{sim} + w\,\mathrm{CE},\qquad
              L_{sim} = \frac{1}{2VB}\sum_{i} \frac{-1}{|P(i)|}\sum_{p\in P(i)}
              \log\frac{\exp(s(i,p)/\tau)}{\sum_{a\ne i}\exp(s(i,a)/\tau)}

    Each step encodes ``views`` (V) times with fresh dropout the B texts of the batch and, for each
    text, its label's text (the name, or ``data.label_descriptions``): 2VB rows, each an anchor (the
    texts in one forward pass, the label texts in a second at their own, shorter width);
    ``P(i)`` = every other row of ``i``'s class, so a text's positives are the other texts of its
    class and every copy of its label. ``s`` is ``similarity``: ``tokens`` (the
    paper's): for each token of ``i`` the best cosine over the tokens of ``a``, averaged over ``i``'s
    tokens (padding excluded), and a label row's similarity to a text is the text's to the label
    (the reference's symmetric mode); ``pooled``: cosine of the ``model.pooling`` embeddings.
    The CE term is on the classifier's logits for the VB text rows; with ``model.head: labels`` the
    classifier is the label texts themselves: logits ``cos(x, label_c)/τ`` of the pooled
    embeddings against all C label texts encoded in the same step, the function the saved head computes.

    Paper: Yehudai, Bandel, "When LLMs are Unfit Use FastFit: Fast and Effective Text Classification
    with Many Classes", NAACL 2024 demo (arXiv 2404.12365); reference code github.com/IBM/fastfit
    (``fastfit/modeling.py``: ``SupConLoss`` at temperature 0.07, ``clf_loss_factor`` 0.1,
    ``rep_tokens: all`` token similarity, ``num_repeats``).

    Args:
        tau: temperature τ > 0. Default 0.07 (``scores_temp``, and SupCon's own).
        similarity: ``tokens`` (default, ``rep_tokens: all``) or ``pooled`` (one vector per text;
            what a ``model.head: labels`` predicts with, so training and prediction compare texts
            and labels the same way).
        views: V >= 1 copies of the batch per step, each with its own dropout masks. Default 4 (the
            reference README's example command; its argparse default is 1).
        clf_weight: w >= 0, weight of the CE term. Default 0.1 (``clf_loss_factor``).

    Inputs: ``text`` (and optional ``text_pair``, encoded jointly) with a class ``label``; 2 or more
    classes; and the label texts,
    which the pipeline tokenises from ``data.label_names`` / the data's labels and
    ``data.label_descriptions``. Batches come from the ``class_balanced`` sampler.

    Relations: with no label rows and ``similarity: pooled`` the contrastive term is ``scl``'s
    (multi-view, λ-free). ``scl`` contrasts texts only and predicts with a trained head.

    Departures from the reference code, each deliberate: no 128-d projection layer and no extra
    dropout on the token states (the similarity is in the encoder's own space, so that a labels head
    is a linear map over the normalised pooled embedding); padding is masked on both sides of the
    token similarity and the average is over real tokens (the reference zeroes only pad-id-0 label
    tokens and divides by the padded width); ``pooled`` uses ``model.pooling`` where the reference's
    ``rep_tokens: cls`` adds batch norm and a projection to the [CLS] state; the CE logits are not
    divided by the number of classes; no 1e-6 inside the logarithm; the contrast is within each
    process's batch, as in the reference (no gathering across processes).
    """

    not_capturable = "its loss averages over the rows with a positive, picked by a boolean mask (a host read)"
    sampler = "class_balanced"
    label_texts = True
    parts = ("ce", "sim")

    def __init__(self, tau: float = 0.07, similarity: str = "tokens", views: int = 4, clf_weight: float = 0.1):
        super().__init__()
        check_range("tau", tau, gt=0.0)
        check_range("views", views, ge=1, le=16)
        check_range("clf_weight", clf_weight, ge=0.0)
        if similarity not in SIMILARITIES:
            raise ValueError(f"similarity must be one of {', '.join(SIMILARITIES)}, got {similarity!r}")
        self.tau, self.similarity, self.views, self.clf_weight = tau, similarity, views, clf_weight

    def forward(self, model, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        heads = getattr(model, "module", model)  # the TextModel under a DDP wrapper
        label_inputs = heads.label_inputs()
        if label_inputs is None:
            raise ValueError("fastfit needs the label texts: the model holds none (TextModel.set_label_texts)")
        f, labels = batch["features"][0], batch["labels"]
        b, v = len(labels), self.views
        # The label texts are a few tokens where the texts are tens: encoded in a pass of their own at
        # their own width instead of padded to the texts' (half the encoder's work a step on SST-2).
        docs = repeat_rows({k: t[labels] for k, t in label_inputs.items()}, v)  # [labels] x V
        if heads.label_head:  # every label once more, for the CE over all classes
            docs = stack_padded(docs, label_inputs, heads.label_pad_id)
        out, out_l = model(repeat_rows(f, v)), model(docs)  # [texts] x V, then the label rows
        n = 2 * b * v
        y = labels.repeat(2 * v)
        is_label = torch.arange(n, device=labels.device) >= b * v  # rows: the VB texts, then their VB labels
        tokens = mask = None  # (a pooled similarity reads the embeddings only)
        if self.similarity == "tokens":
            tokens, mask = stack_token_states((out.tokens, f["attention_mask"].repeat(v, 1)),
                                              (out_l.tokens[:b * v], docs["attention_mask"][:b * v]))
        pooled = torch.cat([out.embeddings, out_l.embeddings[:b * v]])
        sim = fastfit_similarity(tokens, mask, pooled, is_label, self.similarity)
        sim_loss = supcon_from_similarity(sim, y, self.tau)
        if heads.label_head:
            x = F.normalize(out.embeddings.float(), dim=-1)
            w = F.normalize(out_l.embeddings[b * v:].float(), dim=-1)
            logits = x @ w.T / heads.spec.temperature
        else:
            logits = out.logits
        ce = cross_entropy(logits, labels.repeat(v))
        loss = sim_loss + self.clf_weight * ce
        return {"loss": loss, "ce": ce.detach(), "sim": sim_loss.detach()}
