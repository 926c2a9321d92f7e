"""One finished run as ``report`` and ``sweep`` read it: its recipe's fingerprint, its seed, and
one number per metric from (first found) ``eval.json`` (``finetune eval``, calibration included),
``best/eval_metrics.json`` (the best evaluation during training), ``summary.json``'s ``final_eval``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from finetune_cli.errors import DataError, FinetuneError, RunDirError
from finetune_cli.metrics.names import CALIBRATION_METRICS
from finetune_cli.metrics.stats import metric_values
from finetune_cli.rundir import BEST, BEST_METRICS, EVAL, SUMMARY, RunDir, read_json_object, seed_of


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



def load_run(run_dir: Path) -> RunRecord:
    run = RunDir(run_dir)
    try:
        stored = run.read_recipe()
    except RunDirError as e:
        raise DataError(str(e)) from None
    recipe = stored.to_dict()
    summary = run.read_summary()
    if summary is None:
        raise DataError(f"run {run_dir} is not finished (no summary.json): rerun its `finetune train` "
                        f"command, or leave it out")
    ev = read_json_object(run / EVAL)
    best = read_json_object(run.best / BEST_METRICS)
    data = recipe.get("data") or {}
    labels = summary.get("labels") or []
    if ev is not None:
        ev_src = run / EVAL
        metrics = metric_values(ev.get("metrics") or {}, f"`metrics` of {ev_src}")
        cal = ev.get("calibration") or {}
        if not isinstance(cal, dict):
            raise DataError(f"`calibration` of {ev_src} must be an object, got {type(cal).__name__}")
        metrics.update(metric_values({k: cal[k] for k in CALIBRATION_METRICS if cal.get(k) is not None},
                                     f"`calibration` of {ev_src}"))
        source, task_data, labels = EVAL, str(ev.get("data")), ev.get("labels") or labels
    else:
        if best is not None:
            metrics = metric_values({k: v for k, v in best.items() if k != "step"},
                                    str(run.best / BEST_METRICS))
            source = f"{BEST}/{BEST_METRICS}"
        else:
            metrics = metric_values(summary.get("final_eval") or {}, f"`final_eval` of {run.summary_file}")
            source = SUMMARY
        task_data = str(data.get("eval") or f"{data.get('dataset')}[{data.get('eval_split', 'validation')}]")
    if not metrics:
        raise DataError(f"run {run_dir} has no evaluation metrics (trained without evaluation data); "
                        f"run `finetune eval {run_dir}` first")
    seed = summary.get("seed", (recipe.get("train") or {}).get("seed"))
    if seed is None:
        seed = seed_of(run_dir)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise DataError(f"the seed of run {run_dir} is {seed!r}, not an integer (summary.json `seed`)")
    name = run_dir.parent.name if seed_of(run_dir) is not None else run_dir.name
    task = task_data + (f" (labels: {', '.join(map(str, labels))})" if labels else "")
    objective = (recipe.get("objective") or {}).get("name", "?")
    return RunRecord(path=str(run_dir), group=name, fingerprint=stored.fingerprint(ignore_seeds=True), seed=int(seed),
                     objective=objective, source=source, task=task, metrics=metrics)


def seed_values(run_dirs: Sequence[Path], seeds: Sequence[int], metric: str) -> dict[int, float]:
    """The per-seed value ``finetune report`` would use for each finished run."""
    out = {}
    for seed, d in zip(seeds, run_dirs, strict=True):
        rec = load_run(Path(d))
        if metric not in rec.metrics:
            raise FinetuneError(f"--metric {metric}: run {d} has no such metric (have: {', '.join(rec.metrics)})")
        out[seed] = rec.metrics[metric]
    return out
