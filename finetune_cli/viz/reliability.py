"""Reliability diagram (Guo et al. 2017, Fig. 1): accuracy against confidence per bin."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from finetune_cli.viz._mpl import pyplot, save


def reliability_diagram(bins: Sequence[dict[str, Any]], path: Path, *, ece: float, mce: float,
                        title: str = "") -> Path:
    """Write a PNG: top, accuracy per confidence bin with the gap to the diagonal shaded and the
    bin counts written above the bars; bottom, the number of predictions per bin.

    ``bins`` are :class:`~finetune_cli.metrics.calibration.ReliabilityBin` dicts.
    """
    plt = pyplot()
    fig, (ax, hx) = plt.subplots(2, 1, figsize=(5.0, 6.2), sharex=True,
                                 gridspec_kw={"height_ratios": [3, 1], "hspace": 0.08})
    width = bins[0]["upper"] - bins[0]["lower"]
    lefts = [b["lower"] for b in bins]
    acc = [b["accuracy"] or 0.0 for b in bins]
    counts = [b["count"] for b in bins]
    ax.bar(lefts, acc, width=width, align="edge", color="#3b75af", edgecolor="black", linewidth=0.6,
           label="accuracy")
    for b, a in zip(bins, acc, strict=True):
        if b["count"]:
            c = b["mean_confidence"]
            ax.bar(b["lower"], c - a, bottom=a, width=width, align="edge", color="#e8736c", alpha=0.45,
                   edgecolor="#c0392b", hatch="//", linewidth=0.4)
            ax.text(b["lower"] + width / 2, max(a, c) + 0.012, str(b["count"]), ha="center", va="bottom",
                    fontsize=6.5)
    ax.plot([0, 1], [0, 1], "--", color="grey", linewidth=1, label="perfect calibration")
    ax.bar([0], [0], color="#e8736c", alpha=0.45, hatch="//", label="gap (confidence − accuracy)")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.08)
    ax.set_ylabel("accuracy")
    ax.legend(loc="upper left", fontsize=8)
    ax.text(0.98, 0.04, f"ECE {ece:.4f}\nMCE {mce:.4f}", transform=ax.transAxes, ha="right", va="bottom",
            fontsize=9, bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.85})
    if title:
        ax.set_title(title, fontsize=10)
    hx.bar(lefts, counts, width=width, align="edge", color="#888888", edgecolor="black", linewidth=0.5)
    hx.set_ylabel("count")
    hx.set_xlabel("confidence (top softmax probability)")
    return save(fig, path)
