"""``finetune report RUN_DIRS...``: mean ± std per metric per recipe over seeds, and paired
comparisons between recipes over the seeds they share.

Each run contributes one number per metric (``pipelines.runs.load_run`` says which file it
comes from).

Runs are grouped by recipe: the fingerprint of ``recipe.yaml`` with ``train.seed``, ``data.seed``
and ``output`` left out, so the seeds of one recipe fall together whatever folder they sit in.
A group is named after the folder above ``seed-<k>/`` (or the run folder itself).

The statistics are in ``metrics.stats``; the rendering in ``cli.report_render``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from finetune_cli.errors import DataError
from finetune_cli.fsutil import check_output_file, real_path
from finetune_cli.metrics.names import REFIT_METRICS, ordered
from finetune_cli.metrics.stats import mean_std, paired_stats
from finetune_cli.pipelines.runs import RunRecord, load_run
from finetune_cli.rundir import RunDir, expand_run_dirs


@dataclass
class GroupStats:
    name: str
    fingerprint: str
    objective: str
    seeds: list[int]
    stats: dict[str, dict[str, Any]]  # metric -> {mean, std, n, values: {seed: value}}


@dataclass
class Comparison:
    a: str
    b: str
    metric: str
    n: int
    seeds: list[int]
    mean_a: Optional[float]
    mean_b: Optional[float]
    diff: Optional[float]
    ci95: Optional[list[float]]
    t_pvalue: Optional[float]
    wilcoxon_pvalue: Optional[float]
    note: str = ""


@dataclass
class Report:
    task: str
    metrics: list[str]
    groups: list[GroupStats]
    comparisons: list[Comparison]
    runs: list[RunRecord]
    plot: Optional[str] = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---- the report --------------------------------------------------------------------------------

def _assign_groups(runs: list[RunRecord]) -> list[str]:
    """Group names in order of first appearance; one fingerprint -> one name, names made unique."""
    by_fp: dict[str, str] = {}
    taken: dict[str, str] = {}
    for r in runs:
        if r.fingerprint in by_fp:
            r.group = by_fp[r.fingerprint]
            continue
        name = r.group
        if name in taken and taken[name] != r.fingerprint:
            name = f"{name}#{r.fingerprint[:6]}"
        by_fp[r.fingerprint] = name
        taken[name] = r.fingerprint
        r.group = name
    return list(dict.fromkeys(by_fp.values()))


def _parse_compare(spec: str, names: list[str]) -> tuple[str, str]:
    parts = [s.strip() for s in spec.split(",")]
    if len(parts) != 2 or not all(parts):
        raise DataError(f"--compare takes two recipe names, A,B (A − B), got {spec!r}")
    for p in parts:
        if p not in names:
            raise DataError(f"--compare: no recipe named `{p}` among the runs (have: {', '.join(names)})")
    if parts[0] == parts[1]:
        raise DataError(f"--compare {spec}: compare two different recipes")
    return parts[0], parts[1]


def _group_stats(name: str, members: list[RunRecord], metrics: list[str]) -> GroupStats:
    seen: dict[int, str] = {}
    for r in members:
        if r.seed in seen:
            raise DataError(f"runs {seen[r.seed]} and {r.path} are the same recipe with the same seed {r.seed}; "
                            f"keep one")
        seen[r.seed] = r.path
    members = sorted(members, key=lambda r: r.seed)
    st = {}
    for m in metrics:
        vals = {r.seed: r.metrics[m] for r in members}
        mean, std = mean_std(list(vals.values()))
        st[m] = {"mean": mean, "std": std, "n": len(vals), "values": vals}
    return GroupStats(name=name, fingerprint=members[0].fingerprint, objective=members[0].objective,
                      seeds=[r.seed for r in members], stats=st)


def build_report(paths: Sequence[str], compare: Sequence[str] = (), plot: Optional[Path] = None) -> Report:
    """Read the runs, check they are comparable, and compute the statistics (and the plot)."""
    if not paths:
        raise DataError("no run directories given")
    if plot is not None:
        check_output_file(plot, "--plot")
    runs = [load_run(p) for p in expand_run_dirs(paths)]
    # The refitted head's training accuracy describes training, not the evaluation: runs with and
    # without train.refit_head (fewshot/ce against fewshot/head) compare on what they all evaluate.
    for m in REFIT_METRICS:
        if not all(m in r.metrics for r in runs):
            for r in runs:
                r.metrics.pop(m, None)
    first = runs[0]
    for r in runs[1:]:
        if set(r.metrics) != set(first.metrics):
            raise DataError(f"runs report different metrics: {first.path} has {', '.join(ordered(set(first.metrics)))} "
                            f"({first.source}); {r.path} has {', '.join(ordered(set(r.metrics)))} ({r.source}); "
                            f"evaluate every run the same way (e.g. `finetune eval RUN` for each)")
        if r.task != first.task:
            raise DataError(f"runs are on different tasks: {first.path} evaluates on {first.task}, "
                            f"{r.path} on {r.task}")
    names = _assign_groups(runs)
    metrics = ordered(set(first.metrics))
    groups = [_group_stats(name, [r for r in runs if r.group == name], metrics) for name in names]
    pairs = [_parse_compare(c, names) for c in compare]
    if not pairs and len(names) == 2:
        pairs = [(names[1], names[0])]
    comparisons = []
    gmap = {g.name: g for g in groups}
    for a, b in pairs:
        ga, gb = gmap[a], gmap[b]
        shared = sorted(set(ga.seeds) & set(gb.seeds))
        for m in metrics:
            va = [ga.stats[m]["values"][s] for s in shared]
            vb = [gb.stats[m]["values"][s] for s in shared]
            comparisons.append(Comparison(a=a, b=b, metric=m, seeds=shared, **paired_stats(va, vb)))
    rep = Report(task=first.task, metrics=metrics, groups=groups, comparisons=comparisons, runs=runs)
    if plot is not None:
        from finetune_cli.viz._mpl import available

        if available():
            from finetune_cli.viz.report import report_plot

            rep.plot = str(report_plot(rep, plot))
        else:
            rep.notes.append("plot skipped: matplotlib is not installed (pip install 'finetune-cli[plots]')")
    return rep


def default_plot_path(paths: Sequence[str]) -> Path:
    """``report.png`` in the folder that holds all the runs given."""
    try:
        common = Path(os.path.commonpath([str(real_path(p)) for p in paths]))  # a link loop stays a path
    except ValueError:
        common = Path.cwd()
    if RunDir(common).recipe_file.is_file():
        common = common.parent
    return common / "report.png"
