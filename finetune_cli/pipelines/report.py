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

Paired comparison of recipe A against recipe B on the seeds both have (n pairs, d = a − b):
mean difference, its 95% confidence interval ``mean ± t(0.975, n−1)·sd/√n``, the two-sided
paired t-test p-value (``scipy.stats.ttest_rel``) and, with at least 5 pairs, the exact
Wilcoxon signed-rank p-value (``scipy.stats.wilcoxon``; with 5 pairs its smallest possible value
is 2/2⁵ = 0.0625).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import yaml

from finetune_cli.errors import DataError
from finetune_cli.pipelines.multiseed import seed_of

METRIC_ORDER = ("accuracy", "f1_macro", "mcc", "ece", "mce", "nll", "pearson", "spearman")
MIN_WILCOXON = 5


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


# ---- statistics --------------------------------------------------------------------------------

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


# ---- reading runs ------------------------------------------------------------------------------

def _has_run(p: Path) -> bool:
    return (p / "recipe.yaml").is_file()


def expand_run_dirs(paths: Sequence[str]) -> list[Path]:
    """Run directories as given; a folder that is not a run but holds runs (``seed-*/``) expands to them."""
    out: list[Path] = []
    for s in paths:
        p = Path(s)
        if not p.is_dir():
            raise DataError(f"run directory not found: {s}")
        if _has_run(p):
            out.append(p)
            continue
        kids = sorted((q for q in p.iterdir() if q.is_dir() and _has_run(q)),
                      key=lambda q: (seed_of(q) is None, seed_of(q) or 0, q.name))
        if not kids:
            raise DataError(f"{s} is not a finetune run directory (no recipe.yaml) and holds none")
        out.extend(kids)
    seen: set[Path] = set()
    uniq = []
    for p in out:
        if p.resolve() not in seen:
            seen.add(p.resolve())
            uniq.append(p)
    return uniq


def recipe_fingerprint(recipe: dict[str, Any]) -> str:
    """Hash of a stored recipe without what differs between the seeds of one recipe."""
    d = json.loads(json.dumps(recipe, default=str))
    d.pop("output", None)
    for section, key in (("train", "seed"), ("data", "seed")):
        if isinstance(d.get(section), dict):
            d[section].pop(key, None)
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def _read_json(p: Path) -> Optional[dict[str, Any]]:
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError:
        raise DataError(f"{p} is not valid JSON") from None


def load_run(run_dir: Path) -> RunRecord:
    try:
        recipe = yaml.safe_load((run_dir / "recipe.yaml").read_text()) or {}
    except yaml.YAMLError:
        raise DataError(f"{run_dir / 'recipe.yaml'} cannot be read") from None
    summary = _read_json(run_dir / "summary.json")
    if summary is None:
        raise DataError(f"run {run_dir} is not finished (no summary.json): rerun its `finetune train` "
                        f"command, or leave it out")
    ev = _read_json(run_dir / "eval.json")
    best = _read_json(run_dir / "best" / "eval_metrics.json")
    data = recipe.get("data") or {}
    labels = summary.get("labels") or []
    if ev is not None:
        metrics = {k: float(v) for k, v in (ev.get("metrics") or {}).items()}
        cal = ev.get("calibration") or {}
        metrics.update({k: float(cal[k]) for k in ("ece", "mce", "nll") if cal.get(k) is not None})
        source, task_data, labels = "eval.json", str(ev.get("data")), ev.get("labels") or labels
    else:
        if best is not None:
            metrics, source = {k: float(v) for k, v in best.items() if k != "step"}, "best/eval_metrics.json"
        else:
            metrics, source = {k: float(v) for k, v in (summary.get("final_eval") or {}).items()}, "summary.json"
        task_data = str(data.get("eval") or f"{data.get('dataset')}[{data.get('eval_split', 'validation')}]")
    if not metrics:
        raise DataError(f"run {run_dir} has no evaluation metrics (trained without evaluation data); "
                        f"run `finetune eval {run_dir}` first")
    seed = summary.get("seed", (recipe.get("train") or {}).get("seed"))
    if seed is None:
        seed = seed_of(run_dir)
    name = run_dir.parent.name if seed_of(run_dir) is not None else run_dir.name
    task = task_data + (f" (labels: {', '.join(map(str, labels))})" if labels else "")
    objective = (recipe.get("objective") or {}).get("name", "?")
    return RunRecord(path=str(run_dir), group=name, fingerprint=recipe_fingerprint(recipe), seed=int(seed),
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
    runs = [load_run(p) for p in expand_run_dirs(paths)]
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
    if _has_run(common):
        common = common.parent
    return common / "report.png"


# ---- rendering ---------------------------------------------------------------------------------

def fmt_mean_std(s: dict[str, Any], digits: int = 4) -> str:
    if s["std"] is None:
        return f"{s['mean']:.{digits}f}"
    return f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f}"


def fmt_p(p: Optional[float]) -> str:
    if p is None:
        return "–"
    return f"{p:.2e}" if p < 1e-3 else f"{p:.4f}"


def fmt_ci(ci: Optional[list[float]]) -> str:
    return f"[{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci else "–"


def to_markdown(rep: Report) -> str:
    lines = [f"Task: {rep.task}", "",
             "| recipe | objective | seeds | " + " | ".join(rep.metrics) + " |",
             "|---|---|---|" + "---:|" * len(rep.metrics)]
    for g in rep.groups:
        lines.append(f"| {g.name} | {g.objective} | {len(g.seeds)} | "
                     + " | ".join(fmt_mean_std(g.stats[m]) for m in rep.metrics) + " |")
    if rep.comparisons:
        lines += ["", "Paired comparison over shared seeds (difference = A − B; 95% CI from the t distribution; "
                      "two-sided paired t-test; Wilcoxon signed-rank with ≥ 5 pairs):", "",
                  "| A − B | metric | n | mean A | mean B | difference | 95% CI | p (paired t) | p (Wilcoxon) |",
                  "|---|---|---:|---:|---:|---:|---|---:|---:|"]
        def f(v: Optional[float]) -> str:
            return "–" if v is None else f"{v:.4f}"

        for c in rep.comparisons:
            diff = "–" if c.diff is None else f"{c.diff:+.4f}"
            lines.append(f"| {c.a} − {c.b} | {c.metric} | {c.n} | {f(c.mean_a)} | {f(c.mean_b)} | {diff} | "
                         f"{fmt_ci(c.ci95)} | {fmt_p(c.t_pvalue)} | {fmt_p(c.wilcoxon_pvalue)} |")
    return "\n".join(lines) + "\n"
