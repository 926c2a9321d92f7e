"""Line plot of ``finetune probe`` results: probe accuracy of each task across stages, one
line style per objective variant, one colour per task."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_probe(results: dict[str, Any], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = results["stages"]
    tasks = results["tasks"]
    styles = ["-", "--", ":", "-."]
    markers = ["o", "s", "^", "D"]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    x = list(range(len(stages)))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(stages) + 3) + 2.5, 4.5))
    for vi, (label, v) in enumerate(results["variants"].items()):
        for j, t in enumerate(tasks):
            ax.plot(x, [row[j] for row in v["matrix"]], linestyle=styles[vi % len(styles)],
                    marker=markers[vi % len(markers)], color=colors[j % len(colors)], label=f"{t} · {label}")
    ax.set_xticks(x)
    ax.set_xticklabels([s if i == 0 else f"{i}:{s}" for i, s in enumerate(stages)], rotation=30, ha="right")
    ax.set_xlabel("after stage (task fine-tuned)")
    ax.set_ylabel("linear-probe accuracy")
    ax.set_title(f"probe {results['mode']}")
    ax.grid(alpha=0.3)
    # outside the axes, so no point (the last stage included) is ever hidden behind it
    ax.legend(fontsize=8, ncol=1, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    out = Path(out)
    tmp = out.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(out)
    return out
