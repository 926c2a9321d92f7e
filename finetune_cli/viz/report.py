"""Box plot of every metric per recipe over seeds, each seed drawn as a point."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from finetune_cli.viz._mpl import pyplot, save


def report_plot(rep, path: Path) -> Path:
    """One panel per metric: a box per recipe, the seeds as points (seeded jitter), the mean as a diamond."""
    plt = pyplot()
    k = len(rep.metrics)
    cols = min(3, k)
    rows = math.ceil(k / cols)
    width = max(3.2, 0.9 * len(rep.groups) + 1.4)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, 3.4 * rows), squeeze=False)
    rng = np.random.default_rng(0)
    names = [g.name for g in rep.groups]
    for ax, m in zip(axes.flat, rep.metrics, strict=False):
        data = [list(g.stats[m]["values"].values()) for g in rep.groups]
        ax.boxplot(data, widths=0.55, showfliers=False)
        ax.set_xticks(range(1, len(names) + 1), names, rotation=20 if len(names) > 3 else 0, fontsize=8)
        for i, vals in enumerate(data, 1):
            ax.scatter(i + rng.uniform(-0.12, 0.12, len(vals)), vals, s=14, alpha=0.7, zorder=3)
            ax.scatter([i], [np.mean(vals)], marker="D", s=22, color="black", zorder=4)
        ax.set_title(m, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    for ax in list(axes.flat)[k:]:
        ax.set_visible(False)
    fig.suptitle(f"{len(rep.runs)} runs · {rep.task}"[:120], fontsize=9)
    fig.tight_layout()
    return save(fig, path)
