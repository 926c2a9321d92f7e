"""Linear probes and what they say about representational collapse (Aghajanyan et al. 2020)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np


def linear_probe_accuracy(xtr: np.ndarray, ytr: Sequence[str], xev: np.ndarray, yev: Sequence[str], c: float,
                          max_iter: int, seed: int) -> float:
    """Standardise, fit L2 logistic regression (a fixed L-BFGS budget), return eval accuracy."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    sc = StandardScaler().fit(xtr)
    clf = LogisticRegression(C=c, max_iter=max_iter, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(sc.transform(xtr), list(ytr))
    return float((clf.predict(sc.transform(xev)) == np.asarray(yev)).mean())


def probe_summary(mode: str, stages: Sequence[str], probed: Sequence[str], matrix: Sequence[Sequence[float]],
                  ) -> dict[str, Any]:
    """From the stage x task accuracy matrix (row 0 = pretrained, row i = after stage i):
    degradation (a task's accuracy right after it was last trained minus at the end), the
    generalization delta (fine-tuned minus pretrained), and for retention the accuracy each time a
    task comes back."""
    m = np.asarray(matrix)
    cols = {t: j for j, t in enumerate(probed)}
    res: dict[str, Any] = {}
    if mode == "generalization":
        res["delta_vs_pretrained"] = {t: float(m[-1, j] - m[0, j]) for t, j in cols.items()}
        return res
    deg = {}
    for t, j in cols.items():
        trained = [i + 1 for i, s in enumerate(stages) if s == t]
        if trained:
            deg[t] = float(m[trained[-1], j] - m[-1, j])
    res["degradation"] = deg
    earlier = [deg[t] for t in dict.fromkeys(stages[:-1]) if t in deg and t != stages[-1]]
    res["mean_degradation_earlier"] = float(np.mean(earlier)) if earlier else 0.0
    if mode == "retention":
        ret = []
        for i, s in enumerate(stages):
            prev = [k for k in range(i) if stages[k] == s]
            if prev:
                j = cols[s]
                ret.append({"stage": i, "task": s, "after_last_training": float(m[prev[-1] + 1, j]),
                            "when_it_comes_back": float(m[i, j]), "after_retraining": float(m[i + 1, j])})
        res["returns"] = ret
    return res
