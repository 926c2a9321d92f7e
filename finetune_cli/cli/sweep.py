"""``finetune sweep``."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from finetune_cli.cli.common import (
    DataDirOpt,
    DeviceOpt,
    JsonOpt,
    Overrides,
    QuietOpt,
    RecipeOpt,
    View,
    command,
)
from finetune_cli.ui import UI


@command
def sweep_cmd(
    ui: UI,
    recipe: RecipeOpt,
    overrides: Overrides = None,
    param: Annotated[Optional[list[str]], typer.Option(
        "--param", "-p", help="KEY=SPEC to search (repeatable); SPEC: uniform:A:B, loguniform:A:B, int:A:B, "
                              "choice:V1,V2,...", show_default=False)] = None,
    trials: Annotated[int, typer.Option("--trials", "-n", min=1, help="Trials in the study (a rerun resumes "
                                                                        "and runs only the missing ones).")] = 20,
    seeds: Annotated[str, typer.Option("--seeds", help="Seeds every trial trains with, e.g. 1-3 or 1,2,5; the "
                                                       "trial's value is the mean over them.")] = "1-3",
    metric: Annotated[str, typer.Option("--metric", help="Evaluation metric to optimise (also train.metric).")]
    = "accuracy",
    direction: Annotated[Optional[str], typer.Option(
        "--direction", help="maximize | minimize (default: minimize for a loss, else maximize).")] = None,
    out: Annotated[Optional[str], typer.Option(
        "--out", help="Sweep directory (default: <output.dir>/sweep-<output.name or recipe name>).")] = None,
    sampler_seed: Annotated[int, typer.Option("--sampler-seed", help="Seed of the TPE sampler.")] = 0,
    prune: Annotated[bool, typer.Option("--prune/--no-prune", help="Median pruning on the evaluations "
                                                                   "during training.")] = True,
    baseline: Annotated[bool, typer.Option(
        "--baseline/--no-baseline", help="Train the recipe's own values over the same seeds and compare the "
                                         "best trial with them (paired).")] = True,
    device: DeviceOpt = "auto",
    data_dir: DataDirOpt = None,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Seed-aware hyper-parameter search (optuna TPE + median pruning):
    finetune sweep -r scl --param objective.tau=choice:0.1,0.3 --param train.lr=loguniform:1e-5:1e-4"""
    from finetune_cli.pipelines.multiseed import parse_seeds
    from finetune_cli.pipelines.sweep import run_sweep

    if direction not in (None, "maximize", "minimize"):
        from finetune_cli.recipe import RecipeError

        raise RecipeError(f"--direction must be maximize or minimize, got {direction!r}")
    res = run_sweep(recipe, overrides or [], param or [], ui, trials=trials, seeds=parse_seeds(seeds),
                    metric=metric, direction=direction, out=out, sampler_seed=sampler_seed, prune=prune,
                    baseline=baseline, device=device, data_dir=data_dir)
    from finetune_cli.cli.sweep_render import render_sweep

    return View(res.to_dict(), lambda ui: render_sweep(ui, res))
