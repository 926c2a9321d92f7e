"""Statistics over seeds: mean ± sample std, and the paired comparison of two recipes.

Paired comparison of recipe A against recipe B on the seeds both have (n pairs, d = a − b):
mean difference, its 95% confidence interval ``mean ± t(0.975, n−1)·sd/√n``, the two-sided
paired t-test p-value (``scipy.stats.ttest_rel``) and, with at least 5 pairs, the exact
Wilcoxon signed-rank p-value (``scipy.stats.wilcoxon``; with 5 pairs its smallest possible value
is 2/2⁵ = 0.0625).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np

from finetune_cli.errors import DataError

MIN_WILCOXON = 5


def mean_std(values: Sequence[float]) -> tuple[float, Optional[float]]:
    """Mean and sample standard deviation (n − 1 in the denominator; None for one value)."""
    x = np.asarray(values, dtype=np.float64)
    return float(x.mean()), (float(x.std(ddof=1)) if len(x) > 1 else None)


def _finite(v: float) -> Optional[float]:
    return float(v) if v is not None and math.isfinite(v) else None


def paired_stats(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    """Paired comparison of ``a`` and ``b`` (same order = same seed): see the module docstring."""
    from scipy import stats

    a_ = np.asarray(a, dtype=np.float64)
    b_ = np.asarray(b, dtype=np.float64)
    n = len(a_)
    out: dict[str, Any] = {"n": n, "mean_a": None, "mean_b": None, "diff": None, "ci95": None, "t_pvalue": None,
                           "wilcoxon_pvalue": None, "note": ""}
    if n == 0:
        out["note"] = "no shared seeds"
        return out
    d = a_ - b_
    out.update(mean_a=float(a_.mean()), mean_b=float(b_.mean()), diff=float(d.mean()))
    if n < 2:
        out["note"] = "one shared seed: no interval or test"
        return out
    sd = float(d.std(ddof=1))
    half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    out["ci95"] = [float(d.mean() - half), float(d.mean() + half)]
    if sd <= 1e-12 * max(1.0, abs(float(d.mean()))):  # equal up to rounding: the t statistic is undefined
        out["note"] = "all differences equal: no test"
        return out
    out["t_pvalue"] = _finite(stats.ttest_rel(a_, b_).pvalue)
    if n >= MIN_WILCOXON and np.any(d != 0):
        out["wilcoxon_pvalue"] = _finite(stats.wilcoxon(a_, b_).pvalue)
    else:
        out["note"] = f"Wilcoxon needs at least {MIN_WILCOXON} pairs"
    return out


def metric_values(d: Any, src: str) -> dict[str, float]:
    """``{metric: number}`` read from a file, checked: one error line naming ``src`` otherwise."""
    if not isinstance(d, dict):
        raise DataError(f"{src} must map metric names to numbers, got {type(d).__name__}")
    out = {}
    for k, v in d.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise DataError(f"metric `{k}` in {src} is {v!r}, not a number")
        out[str(k)] = float(v)
    return out
