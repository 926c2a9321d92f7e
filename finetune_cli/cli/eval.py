"""``finetune eval``."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from finetune_cli.cli.common import DataDirOpt, DeviceOpt, JsonOpt, Overrides, QuietOpt, emit_json, handle_errors
from finetune_cli.ui import UI


@handle_errors
def eval_cmd(
    model: Annotated[str, typer.Argument(help="Run directory, model folder, `embedded`, or hub id.")],
    overrides: Overrides = None,
    recipe: Annotated[Optional[str], typer.Option(
        "--recipe", "-r", help="Recipe naming the evaluation data (default: the run directory's own).")] = None,
    device: DeviceOpt = "auto",
    data_dir: DataDirOpt = None,
    batch_size: Annotated[Optional[int], typer.Option("--batch-size", min=1)] = None,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Evaluate a model: accuracy, macro-F1 and MCC on the recipe's evaluation data; for an embedding
    model, Spearman/Pearson of cosines against gold pair scores, alignment and uniformity."""
    from finetune_cli.pipelines.evaluate import eval_recipe, run_eval

    r = eval_recipe(model, recipe, overrides or [])
    ui = UI(quiet=quiet)
    from finetune_cli.pipelines.similarity import run_eval_similarity, wants_similarity

    run = run_eval_similarity if wants_similarity(model, r) else run_eval  # embedding model: STS metrics
    res = run(model, r, ui, device=device, data_dir=data_dir, batch_size=batch_size)
    if json_out:
        emit_json(res.to_dict())
        return
    from rich.table import Table

    t = Table(title=f"{res.model} on {res.data} ({res.examples} examples)")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for k, v in res.metrics.items():
        t.add_row(k, f"{v:.4f}")
    ui.print(t)
