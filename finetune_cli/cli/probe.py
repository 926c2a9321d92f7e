"""``finetune probe sequential|generalization|retention``."""

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
from finetune_cli.cli.literal_help import LiteralHelpCommand, LiteralHelpGroup
from finetune_cli.ui import UI

app = typer.Typer(cls=LiteralHelpGroup, help="Representational-collapse probes: fine-tune in stages, freeze, fit linear probes.",
                  no_args_is_help=True)

ObjectivesOpt = Annotated[Optional[str], typer.Option(
    "--objectives", help="Comma-separated objectives run with the same protocol and reported side by side; "
                         "parameters as name:key=value (e.g. ce,ce:label_smoothing=0.1). Default: the recipe's.")]
TasksOpt = Annotated[Optional[str], typer.Option("--tasks", help="Comma-separated task names (default: probe.sequence).")]
OverwriteOpt = Annotated[bool, typer.Option("--overwrite", help="Replace a different probe run in the output directory.")]


def _split(s: Optional[str]) -> Optional[list[str]]:
    return [x.strip() for x in s.split(",") if x.strip()] if s else None


def _run(ui: UI, mode: str, recipe: str, overrides, objectives, device, data_dir, overwrite, **plan_kw) -> View:
    from pathlib import Path

    from finetune_cli.cli.probe_render import markdown_table
    from finetune_cli.data.probe_tasks import make_protocol
    from finetune_cli.fsutil import atomic_write_text
    from finetune_cli.pipelines.probe import run_probe
    from finetune_cli.pipelines.recipes import load_probe_recipe

    r = load_probe_recipe(recipe, overrides or [])
    plan = make_protocol(r, mode, **plan_kw)
    res = run_probe(r, plan, ui, variants=_split(objectives), device=device, data_dir=data_dir, overwrite=overwrite)
    md = markdown_table(res)
    atomic_write_text(Path(res["out_dir"]) / "results.md", md)
    return View(res, lambda ui: _render(mode, res, md, ui))


def _render(mode: str, res: dict, md: str, ui: UI) -> None:
    from rich.table import Table

    t = Table(title=f"probe {mode}: linear-probe accuracy ({res['out_dir']})")
    t.add_column("variant")
    t.add_column("after stage")
    for task in res["tasks"]:
        t.add_column(task, justify="right")
    for label, v in res["variants"].items():
        for i, (stage, row) in enumerate(zip(res["stages"], v["matrix"], strict=False)):
            t.add_row(label, stage if i == 0 else f"{i}:{stage}", *(f"{x:.4f}" for x in row))
    ui.print(t)
    ui.print(md.split("\n\n", 2)[-1].strip())
    ui.log(f"wrote {res['out_dir']}/results.json, results.md, accuracy.png")


@app.command("sequential", cls=LiteralHelpCommand)
@command
def sequential(ui: UI, recipe: RecipeOpt, overrides: Overrides = None, tasks: TasksOpt = None,
               objectives: ObjectivesOpt = None, device: DeviceOpt = "auto", data_dir: DataDirOpt = None,
               overwrite: OverwriteOpt = False, json_out: JsonOpt = False, quiet: QuietOpt = False) -> View:
    """Fine-tune on tasks in order; probe every task after every stage: finetune probe sequential -r probe_sequential"""
    return _run(ui, "sequential", recipe, overrides, objectives, device, data_dir, overwrite, tasks=_split(tasks))


@app.command("generalization", cls=LiteralHelpCommand)
@command
def generalization(ui: UI, recipe: RecipeOpt, overrides: Overrides = None,
                   source: Annotated[Optional[str], typer.Option("--source", help="Task to fine-tune on (default: probe.source).")] = None,
                   targets: Annotated[Optional[str], typer.Option("--targets", help="Comma-separated tasks to probe (default: the others).")] = None,
                   objectives: ObjectivesOpt = None, device: DeviceOpt = "auto", data_dir: DataDirOpt = None,
                   overwrite: OverwriteOpt = False, json_out: JsonOpt = False, quiet: QuietOpt = False) -> View:
    """Fine-tune on one task; probe other tasks with the frozen encoder against the pretrained one."""
    return _run(ui, "generalization", recipe, overrides, objectives, device, data_dir, overwrite,
                source=source, targets=_split(targets))


@app.command("retention", cls=LiteralHelpCommand)
@command
def retention(ui: UI, recipe: RecipeOpt, overrides: Overrides = None, tasks: TasksOpt = None,
              cycles: Annotated[Optional[int], typer.Option("--cycles", min=1, help="Passes over the tasks (default: probe.cycles).")] = None,
              objectives: ObjectivesOpt = None, device: DeviceOpt = "auto", data_dir: DataDirOpt = None,
              overwrite: OverwriteOpt = False, json_out: JsonOpt = False, quiet: QuietOpt = False) -> View:
    """Cycle A -> B -> C -> A ... and score each task when it comes back."""
    return _run(ui, "retention", recipe, overrides, objectives, device, data_dir, overwrite,
                tasks=_split(tasks), cycles=cycles)
