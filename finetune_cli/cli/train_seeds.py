"""``finetune train --seeds``: run and render one run per seed."""

from __future__ import annotations

from typing import Optional

from finetune_cli.cli.common import View
from finetune_cli.errors import RunDirError


def train_seeds(plan, seeds: str, ui, *, device: str, data_dir: Optional[str], resume: Optional[str],
                overwrite: bool) -> View:
    from finetune_cli.pipelines.multiseed import parse_seeds, run_seeds

    if resume is not None:
        raise RunDirError("--resume names one checkpoint and cannot be used with --seeds "
                          "(rerunning the command resumes every unfinished seed)")
    seed_list = parse_seeds(seeds)
    outs = run_seeds(plan, seed_list, ui, device=device, data_dir=data_dir, overwrite=overwrite)
    rows = []
    for seed, o in zip(seed_list, outs, strict=True):
        status = "skipped (complete)" if o.already_complete else ("resumed" if o.resumed_from else "trained")
        rows.append({"seed": seed, "status": status, **o.summary})
    return View(rows, lambda ui: _render(plan, rows, ui), enforce=lambda g, ui: _gate_seeds(g, outs, seed_list, ui))


def _render(plan, rows: list, ui) -> None:
    from rich.table import Table

    from finetune_cli.metrics.stats import mean_std

    metric = next((r["metric"] for r in rows if r.get("metric")), None)
    t = Table(title=f"{len(rows)} seeds · {plan.run_dir}")
    for c in ("seed", "status", "run", "steps", "train s", f"best {metric}" if metric else "best"):
        t.add_column(c, justify="right" if c not in ("status", "run") else "left")
    for r in rows:
        best = f"{r['best_metric']:.4f}" if r.get("best_metric") is not None else "-"
        t.add_row(str(r["seed"]), r["status"], r["run_dir"], str(r["steps"]), str(r["train_seconds"]), best)
    vals = [r["best_metric"] for r in rows if r.get("best_metric") is not None]
    if vals:
        m, s = mean_std(vals)
        t.add_row("all", "", "mean ± std", "", "", f"{m:.4f} ± {s:.4f}" if s is not None else f"{m:.4f}")
    ui.print(t)


def _gate_seeds(gates, outs, seed_list, ui) -> None:
    """``--expect`` holds for every seed's final evaluation; the failures of all seeds on one line."""
    from finetune_cli.metrics.gates import GateFailed, enforce_on_run

    failed = []
    for seed, o in zip(seed_list, outs, strict=True):
        try:
            enforce_on_run(gates, o.summary, ui, f" (seed {seed})")
        except GateFailed as e:
            failed.append(str(e).removeprefix("quality gate failed"))
    if failed:
        raise GateFailed("quality gate failed" + ";".join(failed))
