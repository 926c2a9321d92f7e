"""``finetune train``."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from finetune_cli.cli.common import (
    DataDirOpt,
    DeviceOpt,
    ExpectOpt,
    JsonOpt,
    Overrides,
    QuietOpt,
    RecipeOpt,
    View,
    command,
)
from finetune_cli.errors import RecipeError
from finetune_cli.pipelines.recipes import load_plan
from finetune_cli.ui import UI


@command
def train(
    ui: UI,
    gates: list,
    recipe: RecipeOpt,
    overrides: Overrides = None,
    device: DeviceOpt = "auto",
    data_dir: DataDirOpt = None,
    resume: Annotated[Optional[str], typer.Option(
        "--resume", help="Resume from this checkpoint directory. Without it, a rerun into the same run "
                         "directory resumes from its newest checkpoint.")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a different run in the output directory.")] = False,
    seeds: Annotated[Optional[str], typer.Option(
        "--seeds", help="Train once per seed (e.g. 1,2,3 or 1-5) into <output.dir>/<name>/seed-<k>/; "
                        "finished seeds are skipped, interrupted ones resume.")] = None,
    expect: ExpectOpt = None,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
    private: Annotated[bool, typer.Option(
        "--private", help="With output.push_to_hub: create the Hub repository private (output.hub_private).")] = False,
    nproc: Annotated[int, typer.Option(
        "--nproc", min=1, help="Train on N processes: reruns this command under `torchrun --standalone "
                               "--nproc_per_node N` (ignored when already started by a launcher).")] = 1,
) -> None:
    """Fine-tune a model with a recipe: finetune train --recipe recipes/scl.yaml train.epochs=3"""
    from finetune_cli.engine.launch import relaunch, should_relaunch
    from finetune_cli.metrics.gates import check_known, enforce_on_run
    from finetune_cli.pipelines.train import preflight, run_train

    plan = load_plan(recipe, [*(overrides or []), *(["output.hub_private=true"] if private else [])])
    if plan.recipe.output.push_to_hub and seeds is not None:
        raise RecipeError("output.push_to_hub pushes one run: train the seeds without it, then "
                          "`finetune push` the one to share")
    if gates and plan.metrics:  # fail before training, not after it
        check_known(gates, plan.metrics, " in the final evaluation of training")
    if should_relaunch(nproc):  # bad input is one line from here, not one from each of N processes
        preflight(plan, device=device, data_dir=data_dir)
        raise typer.Exit(relaunch(nproc, sys.argv[1:], sys.argv[0]))
    if seeds is not None:
        from finetune_cli.cli.train_seeds import train_seeds

        return train_seeds(plan, seeds, ui, device=device, data_dir=data_dir, resume=resume, overwrite=overwrite)
    out = run_train(plan, ui, device=device, data_dir=data_dir, resume=resume, overwrite=overwrite)
    return View(out.summary, lambda ui: _render(out, ui), enforce=lambda g, ui: enforce_on_run(g, out.summary, ui))


def _render(out, ui: UI) -> None:
    from rich.table import Table

    s = out.summary
    t = Table(title=f"run {out.run_dir}", show_header=False)
    for k in ("objective", "steps", "train_examples", "samples_per_second", "train_seconds", "device", "precision"):
        t.add_row(k, str(s.get(k)))
    if s.get("metric"):
        t.add_row(f"best {s['metric']}", f"{s['best_metric']:.4f} (step {s['best_step']})")
    for k, v in (s.get("final_eval") or {}).items():
        t.add_row(f"final {k}", f"{v:.4f}")
    ui.print(t)
