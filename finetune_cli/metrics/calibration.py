"""Calibration of a classifier's confidence: ECE, MCE and reliability bins (Guo et al. 2017).

Guo, Pleiss, Sun, Weinberger, "On Calibration of Modern Neural Networks", ICML 2017
(arXiv 1706.04599). The confidence of a prediction is its top softmax probability
:math:`\\hat p_i = \\max_c \\mathrm{softmax}(z_i)_c`. The interval [0, 1] is cut into M equal-width
bins :math:`I_m = ((m-1)/M,\\ m/M]` (a confidence of exactly 0 falls into the first bin). With
:math:`B_m` the predictions whose confidence falls in :math:`I_m`:

.. math::
    \\mathrm{acc}(B_m) = \\frac{1}{|B_m|}\\sum_{i\\in B_m} 1[\\hat y_i = y_i], \\quad
    \\mathrm{conf}(B_m) = \\frac{1}{|B_m|}\\sum_{i\\in B_m} \\hat p_i

.. math::
    \\mathrm{ECE} = \\sum_{m=1}^{M} \\frac{|B_m|}{n}\\,|\\mathrm{acc}(B_m) - \\mathrm{conf}(B_m)|, \\qquad
    \\mathrm{MCE} = \\max_{m:\\,|B_m|>0} |\\mathrm{acc}(B_m) - \\mathrm{conf}(B_m)|

Guo et al. use M = 15, the default here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np

DEFAULT_BINS = 15


@dataclass(frozen=True)
class ReliabilityBin:
    """One confidence bin ``(lower, upper]``; ``mean_confidence``/``accuracy`` are None when empty."""

    lower: float
    upper: float
    count: int
    mean_confidence: Optional[float]
    accuracy: Optional[float]

    @property
    def gap(self) -> Optional[float]:
        if self.count == 0:
            return None
        return abs(self.accuracy - self.mean_confidence)  # type: ignore[operator]

    def to_dict(self) -> dict:
        return asdict(self)


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax, stable for large logits (the row maximum is subtracted first)."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def _check(confidences: np.ndarray, correct: np.ndarray, n_bins: int) -> tuple[np.ndarray, np.ndarray]:
    conf = np.asarray(confidences, dtype=np.float64).reshape(-1)
    corr = np.asarray(correct).reshape(-1).astype(np.float64)
    if conf.shape != corr.shape:
        raise ValueError(f"confidences ({conf.size}) and correct ({corr.size}) differ in length")
    if conf.size == 0:
        raise ValueError("calibration needs at least one prediction")
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    if np.any(conf < 0) or np.any(conf > 1) or not np.all(np.isfinite(conf)):
        raise ValueError("confidences must lie in [0, 1]")
    return conf, corr


def bin_index(confidences: np.ndarray, n_bins: int) -> np.ndarray:
    """Bin of each confidence: bin m (0-based) holds ``(m/M, (m+1)/M]``; 0 goes to bin 0."""
    # Edges from linspace, compared with right=True, so a confidence on an edge (0.6 with M = 5)
    # lands in the bin it closes, whatever the rounding of 0.6 * 5.
    inner = np.linspace(0.0, 1.0, n_bins + 1)[1:-1]
    return np.digitize(np.asarray(confidences, dtype=np.float64), inner, right=True)


def reliability_bins(confidences: np.ndarray, correct: np.ndarray, n_bins: int = DEFAULT_BINS,
                     ) -> list[ReliabilityBin]:
    """Count, mean confidence and accuracy of each of ``n_bins`` equal-width confidence bins."""
    conf, corr = _check(confidences, correct, n_bins)
    idx = bin_index(conf, n_bins)
    counts = np.bincount(idx, minlength=n_bins)
    conf_sum = np.bincount(idx, weights=conf, minlength=n_bins)
    corr_sum = np.bincount(idx, weights=corr, minlength=n_bins)
    out = []
    for m in range(n_bins):
        c = int(counts[m])
        out.append(ReliabilityBin(lower=m / n_bins, upper=(m + 1) / n_bins, count=c,
                                  mean_confidence=float(conf_sum[m] / c) if c else None,
                                  accuracy=float(corr_sum[m] / c) if c else None))
    return out


def expected_calibration_error(confidences: np.ndarray, correct: np.ndarray, n_bins: int = DEFAULT_BINS) -> float:
    """ECE: the count-weighted mean gap between accuracy and confidence over the bins."""
    bins = reliability_bins(confidences, correct, n_bins)
    n = sum(b.count for b in bins)
    return float(sum(b.count / n * b.gap for b in bins if b.count))


def maximum_calibration_error(confidences: np.ndarray, correct: np.ndarray, n_bins: int = DEFAULT_BINS) -> float:
    """MCE: the largest gap between accuracy and confidence over the non-empty bins."""
    return float(max(b.gap for b in reliability_bins(confidences, correct, n_bins) if b.count))


def calibration_metrics(logits: np.ndarray, labels: np.ndarray, n_bins: int = DEFAULT_BINS) -> dict:
    """ECE, MCE, negative log-likelihood and the reliability bins of a classifier's logits.

    Returns ``{"ece", "mce", "nll", "n_bins", "bins": [ReliabilityBin as dict, ...]}``.
    """
    probs = softmax(logits)
    labels = np.asarray(labels).astype(np.int64)
    conf = probs.max(axis=-1)
    correct = probs.argmax(axis=-1) == labels
    bins = reliability_bins(conf, correct, n_bins)
    n = len(conf)
    ece = float(sum(b.count / n * b.gap for b in bins if b.count))
    mce = float(max(b.gap for b in bins if b.count))
    nll = float(-np.mean(np.log(np.clip(probs[np.arange(n), labels], 1e-12, None))))
    return {"ece": ece, "mce": mce, "nll": nll, "n_bins": n_bins, "bins": [b.to_dict() for b in bins]}
