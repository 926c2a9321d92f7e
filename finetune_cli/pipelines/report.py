"""``finetune report RUN_DIRS...``: mean ± std per metric per recipe over seeds, and paired
comparisons between recipes over the seeds they share.

Each run contributes one number per metric, read from (first found):

1. ``eval.json`` written by ``finetune eval`` (accuracy, F1, MCC, plus ECE, MCE and NLL), the
   held-out evaluation;
2. ``best/eval_metrics.json``, the evaluation of the checkpoint kept during training;
3. ``summary.json``'s ``final_eval``.

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

from finetune_cli import rundir
from finetune_cli.errors import DataError, RunDirError
from finetune_cli.fsutil import check_output_file
from finetune_cli.metrics.stats import mean_std, metric_values, paired_stats

METRIC_ORDER = ("accuracy", "f1_macro", "mcc", "ece", "mce", "nll", "pearson", "spearman")


@dataclass
class RunRecord:
    path: str
    group: str
    fingerprint: str
    seed: int
    objective: str
    source: str
    task: str
    metrics: dict[str, float]


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


# ---- reading runs ------------------------------------------------------------------------------

_read_json = rundir.read_json_object


def load_run(run_dir: Path) -> RunRecord:
    try:
        stored = rundir.read_recipe(run_dir)
    except RunDirError as e:
        raise DataError(str(e)) from None
    recipe = stored.to_dict()
    summary = _read_json(run_dir / rundir.SUMMARY)
    if summary is None:
        raise DataError(f"run {run_dir} is not finished (no summary.json): rerun its `finetune train` "
                        f"command, or leave it out")
    ev = _read_json(run_dir / rundir.EVAL)
    best = _read_json(run_dir / rundir.BEST / "eval_metrics.json")
    data = recipe.get("data") or {}
    labels = summary.get("labels") or []
    if ev is not None:
        ev_src = run_dir / "eval.json"
        metrics = metric_values(ev.get("metrics") or {}, f"`metrics` of {ev_src}")
        cal = ev.get("calibration") or {}
        if not isinstance(cal, dict):
            raise DataError(f"`calibration` of {ev_src} must be an object, got {type(cal).__name__}")
        metrics.update(metric_values({k: cal[k] for k in ("ece", "mce", "nll") if cal.get(k) is not None},
                                     f"`calibration` of {ev_src}"))
        source, task_data, labels = "eval.json", str(ev.get("data")), ev.get("labels") or labels
    else:
        if best is not None:
            metrics = metric_values({k: v for k, v in best.items() if k != "step"},
                                    str(run_dir / rundir.BEST / "eval_metrics.json"))
            source = "best/eval_metrics.json"
        else:
            metrics = metric_values(summary.get("final_eval") or {}, f"`final_eval` of {run_dir / rundir.SUMMARY}")
            source = "summary.json"
        task_data = str(data.get("eval") or f"{data.get('dataset')}[{data.get('eval_split', 'validation')}]")
    if not metrics:
        raise DataError(f"run {run_dir} has no evaluation metrics (trained without evaluation data); "
                        f"run `finetune eval {run_dir}` first")
    seed = summary.get("seed", (recipe.get("train") or {}).get("seed"))
    if seed is None:
        seed = rundir.seed_of(run_dir)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise DataError(f"the seed of run {run_dir} is {seed!r}, not an integer (summary.json `seed`)")
    name = run_dir.parent.name if rundir.seed_of(run_dir) is not None else run_dir.name
    task = task_data + (f" (labels: {', '.join(map(str, labels))})" if labels else "")
    objective = (recipe.get("objective") or {}).get("name", "?")
    return RunRecord(path=str(run_dir), group=name, fingerprint=stored.fingerprint(ignore_seeds=True), seed=int(seed),
                     objective=objective, source=source, task=task, metrics=metrics)


def _order(metrics: set[str]) -> list[str]:
    return [m for m in METRIC_ORDER if m in metrics] + sorted(metrics - set(METRIC_ORDER))


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


def build_report(paths: Sequence[str], compare: Sequence[str] = (), plot: Optional[Path] = None) -> Report:
    """Read the runs, check they are comparable, and compute the statistics (and the plot)."""
    if not paths:
        raise DataError("no run directories given")
    if plot is not None:
        check_output_file(plot, "--plot")
    runs = [load_run(p) for p in rundir.expand_run_dirs(paths)]
    first = runs[0]
    for r in runs[1:]:
        if set(r.metrics) != set(first.metrics):
            raise DataError(f"runs report different metrics: {first.path} has {', '.join(_order(set(first.metrics)))} "
                            f"({first.source}); {r.path} has {', '.join(_order(set(r.metrics)))} ({r.source}); "
                            f"evaluate every run the same way (e.g. `finetune eval RUN` for each)")
        if r.task != first.task:
            raise DataError(f"runs are on different tasks: {first.path} evaluates on {first.task}, "
                            f"{r.path} on {r.task}")
    names = _assign_groups(runs)
    metrics = _order(set(first.metrics))
    groups: list[GroupStats] = []
    for name in names:
        members = [r for r in runs if r.group == name]
        seen: dict[int, str] = {}
        for r in members:
            if r.seed in seen:
                raise DataError(f"runs {seen[r.seed]} and {r.path} are the same recipe with the same seed {r.seed}; "
                                f"keep one")
            seen[r.seed] = r.path
        members.sort(key=lambda r: r.seed)
        st = {}
        for m in metrics:
            vals = {r.seed: r.metrics[m] for r in members}
            mean, std = mean_std(list(vals.values()))
            st[m] = {"mean": mean, "std": std, "n": len(vals), "values": vals}
        groups.append(GroupStats(name=name, fingerprint=members[0].fingerprint, objective=members[0].objective,
                                 seeds=[r.seed for r in members], stats=st))
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
        common = Path(os.path.commonpath([str(Path(p).resolve()) for p in paths]))
    except ValueError:
        common = Path.cwd()
    if rundir.has_recipe(common):
        common = common.parent
    return common / "report.png"
