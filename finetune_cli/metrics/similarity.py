"""Similarity metrics on embedding arrays: correlation with gold scores (STS), and the alignment
and uniformity of Wang & Isola, "Understanding Contrastive Representation Learning through
Alignment and Uniformity on the Hypersphere", ICML 2020 (arXiv 2005.10242), as SimCSE reports them.

All functions are pure (numpy in, float out)."""

from __future__ import annotations

import numpy as np


def l2_normalize(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), eps)


def cosine_scores(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two (n, d) arrays."""
    return np.sum(l2_normalize(a) * l2_normalize(b), axis=-1)


def correlations(pred: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    """Spearman and Pearson correlation (scipy) of predicted and gold scores."""
    from scipy.stats import pearsonr, spearmanr

    pred, gold = np.asarray(pred, dtype=np.float64), np.asarray(gold, dtype=np.float64)
    return {"spearman": float(spearmanr(pred, gold)[0]), "pearson": float(pearsonr(pred, gold)[0])}


def alignment(x: np.ndarray, y: np.ndarray, alpha: float = 2.0) -> float:
    r""":math:`\mathbb{E}_{(x,y)\sim p_{pos}} \|f(x)-f(y)\|_2^\alpha` on L2-normalised rows (lower is better)."""
    d = l2_normalize(x) - l2_normalize(y)
    return float(np.mean(np.linalg.norm(d, axis=-1) ** alpha))


def uniformity(x: np.ndarray, t: float = 2.0) -> float:
    r""":math:`\log \mathbb{E}_{i<j} e^{-t\|f(x_i)-f(x_j)\|_2^2}` over all distinct pairs of
    L2-normalised rows (lower is better)."""
    from scipy.spatial.distance import pdist
    from scipy.special import logsumexp

    z = l2_normalize(x)
    if len(z) < 2:
        raise ValueError("uniformity needs at least two embeddings")
    sq = pdist(z, "sqeuclidean")
    return float(logsumexp(-t * sq) - np.log(len(sq)))


def positive_threshold(gold: np.ndarray) -> float:
    """Gold score from which a pair counts as a positive for alignment: 4/5 of the scale's top.

    SimCSE takes STS-B pairs scored ≥ 4 on its 0–5 scale. The top is read from the data: 5 when
    the scores go above 1 (STS-B 0–5, SICK-R 1–5: threshold 4.0 for both — "4 of 5" is read as an
    absolute 4, the same on a 1–5 scale), 1 for scores rescaled to [0, 1] (threshold 0.8).
    """
    top = float(np.max(gold))
    return 0.8 * (5.0 if top > 1.0 else 1.0) if top <= 5.0 else 0.8 * top
