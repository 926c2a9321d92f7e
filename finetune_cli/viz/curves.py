"""Training curves from ``metrics.jsonl``: each loss part and each evaluation metric against the step.

The data behind a picture comes from pure functions (``curve_series``, ``mean_curve``) that the
tests check; the drawing functions only draw what they are given.

One run (``figures/curves.png``): one panel per train loss part (``loss``, ``ce``, ``scl`` …) and one
per evaluation metric (``eval/accuracy`` …); a metric logged both in training and in evaluation
(``loss`` and ``eval/loss``) shares a panel, train and eval as two lines.

Several runs (``finetune report --curves``): the same panels; each run a thin line in its recipe's
colour, the recipe's mean over seeds bold (on the steps every seed logged).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from finetune_cli.viz._mpl import pyplot, save

# Fields of a record that are not curves (bookkeeping, rates, memory).
NOT_CURVES = frozenset({"step", "epoch", "lr", "samples_per_s", "gpu_mem_gb", "gpu_mem_peak_gb"})
EVAL_PREFIX = "eval/"

Series = tuple[list[int], list[float]]


def curve_series(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Series]]:
    """``{panel: {"train"|"eval": (steps, values)}}`` in the order the names first appear.

    A train record's numeric fields other than bookkeeping are loss parts; an eval record's fields
    start with ``eval/``. Non-finite and missing values are skipped; a step logged twice (a resumed
    run) keeps its last value.
    """
    acc: dict[str, dict[str, dict[int, float]]] = {}
    for rec in records:
        step = rec.get("step")
        if not isinstance(step, int):
            continue
        for k, v in rec.items():
            if k in NOT_CURVES or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                continue
            kind, name = ("eval", k[len(EVAL_PREFIX):]) if k.startswith(EVAL_PREFIX) else ("train", k)
            acc.setdefault(name, {}).setdefault(kind, {})[step] = float(v)
    out: dict[str, dict[str, Series]] = {}
    for name, kinds in acc.items():
        out[name] = {kind: (sorted(pts), [pts[s] for s in sorted(pts)]) for kind, pts in kinds.items()}
    # train panels first (loss parts), then evaluation metrics
    return dict(sorted(out.items(), key=lambda kv: "train" not in kv[1]))


def mean_curve(curves: Sequence[Series]) -> Series:
    """Mean over curves at the steps all of them have (seeds of one recipe log the same steps)."""
    if not curves:
        return [], []
    shared = set(curves[0][0])
    for steps, _ in curves[1:]:
        shared &= set(steps)
    steps = sorted(shared)
    maps = [dict(zip(s, v, strict=True)) for s, v in curves]
    return steps, [sum(m[s] for m in maps) / len(maps) for s in steps]


def _grid(n: int):
    plt = pyplot()
    cols = min(3, max(1, n))
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat)


def _visible(steps: Sequence[int], **style: Any) -> dict[str, Any]:
    """``style``, with a marker when there is a single point: one point makes no line, and a run
    shorter than ``train.log_every`` / ``train.eval_every`` logs each metric once."""
    return {"marker": "o", "ms": 4, **style} if len(steps) == 1 else style


def plot_curves(series: Mapping[str, Mapping[str, Series]], path: Path, title: str = "") -> Path:
    """One run: a panel per name in ``series``, train and eval lines."""
    fig, axes = _grid(max(1, len(series)))
    for ax, (name, kinds) in zip(axes, series.items(), strict=False):
        for kind, style in (("train", {"lw": 1.2}), ("eval", {"lw": 1.6, "marker": "o", "ms": 3})):
            if kind in kinds:
                steps, vals = kinds[kind]
                ax.plot(steps, vals, label=kind, **_visible(steps, **style))
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
        if len(kinds) > 1:
            ax.legend(fontsize=7)
    if not series:
        axes[0].text(0.5, 0.5, "nothing logged", ha="center", va="center")
    if title:
        fig.suptitle(title[:120], fontsize=9)
    fig.tight_layout()
    return save(fig, path)


def multi_run_series(groups: Mapping[str, Sequence[Sequence[Mapping[str, Any]]]]
                     ) -> dict[str, dict[str, dict[str, Any]]]:
    """``{panel: {group: {"kind": "train"|"eval", "runs": [Series …], "mean": Series}}}``.

    ``groups``: recipe name -> the ``metrics.jsonl`` records of each of its runs (seeds). A panel
    holds the eval series when there is one, else the train series.
    """
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for group, runs in groups.items():
        per_run = [curve_series(r) for r in runs]
        names = list(dict.fromkeys(n for s in per_run for n in s))
        for name in names:
            kind = "eval" if any("eval" in s.get(name, {}) for s in per_run) else "train"
            curves = [s[name][kind] for s in per_run if kind in s.get(name, {})]
            out.setdefault(name, {})[group] = {"kind": kind, "runs": curves, "mean": mean_curve(curves)}
    return dict(sorted(out.items(), key=lambda kv: any(g["kind"] == "eval" for g in kv[1].values())))


def single_point_panels(data: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> list[str]:
    """Panels of :func:`multi_run_series` data in which no run has two points (each logged once)."""
    return [name for name, by_group in data.items()
            if all(len(steps) < 2 for d in by_group.values() for steps, _ in d["runs"])]


def draw_multi_run(data: Mapping[str, Mapping[str, Mapping[str, Any]]], title: str = ""):
    """Several runs: seeds as thin lines, each recipe's mean bold, one colour per recipe. Returns
    the matplotlib Figure (``finetune report --curves`` saves it)."""
    plt = pyplot()
    fig, axes = _grid(max(1, len(data)))
    groups = list(dict.fromkeys(g for panel in data.values() for g in panel))
    colors = {g: plt.get_cmap("tab10")(i % 10) for i, g in enumerate(groups)}
    for ax, (name, by_group) in zip(axes, data.items(), strict=False):
        kind = ""
        for g, d in by_group.items():
            kind = d["kind"]
            for steps, vals in d["runs"]:
                ax.plot(steps, vals, **_visible(steps, color=colors[g], lw=0.7, alpha=0.45))
            if d["mean"][0]:
                ax.plot(*d["mean"], label=f"{g} (mean of {len(d['runs'])})",
                        **_visible(d["mean"][0], color=colors[g], lw=2.2))
        ax.set_title(f"{name} ({kind})", fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title[:120], fontsize=9)
    fig.tight_layout()
    return fig


def write_curves(run, ui) -> Path | None:
    """``figures/curves.png`` of a run (a ``RunDir``) from its ``metrics.jsonl``; skipped, with a
    warning through ``ui``, without matplotlib."""
    from finetune_cli.viz._mpl import available

    if not run.metrics.exists():
        return None
    if not available():
        ui.warn("figures/curves.png skipped: matplotlib is not installed (pip install 'finetune-cli[plots]')")
        return None
    from finetune_cli.fsutil import own_dir

    own_dir(run.curves.parent, "figures folder")  # a link there is replaced, never written through
    return plot_curves(curve_series(run.metrics.read()), run.curves, title=str(run))
