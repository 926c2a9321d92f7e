"""``finetune eval``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from finetune_cli.cli.common import (
    CudaGraphsOpt,
    DataDirOpt,
    DeviceOpt,
    ExpectOpt,
    JsonOpt,
    ModelArg,
    Overrides,
    PrecisionOpt,
    QuietOpt,
    StrideOpt,
    ThresholdOpt,
    View,
    command,
)
from finetune_cli.ui import UI


@command
def eval_cmd(
    ui: UI,
    model: ModelArg,
    overrides: Overrides = None,
    recipe: Annotated[Optional[str], typer.Option(
        "--recipe", "-r", help="Recipe naming the evaluation data (default: the run directory's own).")] = None,
    device: DeviceOpt = "auto",
    precision: PrecisionOpt = "auto",
    cuda_graphs: CudaGraphsOpt = "off",
    data_dir: DataDirOpt = None,
    batch_size: Annotated[Optional[int], typer.Option("--batch-size", min=1)] = None,
    bins: Annotated[int, typer.Option("--bins", min=1, help="Equal-width confidence bins for ECE/MCE.")] = 15,
    out: Annotated[Optional[str], typer.Option(
        "--out", help="Folder for eval.json and figures/ (default: the run directory evaluated).")] = None,
    no_figures: Annotated[bool, typer.Option("--no-figures", help="Skip the reliability and t-SNE PNGs.")] = False,
    tsne_max: Annotated[int, typer.Option("--tsne-max", min=4, help="Most points in the t-SNE picture.")] = 2000,
    stride: StrideOpt = None,
    threshold: ThresholdOpt = None,
    expect: ExpectOpt = None,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Evaluate a model. Classification: accuracy, macro-F1, MCC, per-class scores, confusion matrix,
    calibration (ECE/MCE) and reliability / t-SNE figures. Embedding model: Spearman/Pearson of cosines
    against gold pair scores, alignment and uniformity."""
    from finetune_cli.metrics.names import CALIBRATION_METRICS
    from finetune_cli.pipelines.evaluate import eval_plan, evaluate

    # The run's own evaluation is eval.json (what `report` reads); other data gets its own file.
    name = "eval" if recipe is None or out is not None else f"eval-{Path(recipe).stem}"
    res = evaluate(model, eval_plan(model, recipe, overrides or []), ui, device=device, precision=precision,
                   data_dir=data_dir, batch_size=batch_size, bins=bins, figures=not no_figures, out=out,
                   tsne_max=tsne_max, name=name, stride=stride, threshold=threshold,
                   cuda_graphs=cuda_graphs)
    gated = {**res.metrics, **{k: res.calibration[k] for k in CALIBRATION_METRICS
                               if res.calibration and res.calibration.get(k) is not None}}
    return View(res.to_dict(), lambda ui: _render(res, ui), gated=lambda: gated)


def _render(res, ui: UI) -> None:
    from finetune_cli.metrics.names import CALIBRATION_METRICS

    t = _metrics_table(res)
    if res.calibration is not None:
        for k in CALIBRATION_METRICS:
            t.add_row(k + (f" ({res.calibration['n_bins']} bins)" if k != "nll" else ""),
                      f"{res.calibration[k]:.4f}")
    ui.print(t)
    if res.per_class is not None:
        from finetune_cli.cli.eval_render import render_classification

        render_classification(ui, res)


def _metrics_table(res):
    """The metric/value table both evaluation kinds start from."""
    from rich.table import Table

    t = Table(title=f"{res.model} on {res.data} ({res.examples} examples)")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for k, v in res.metrics.items():
        t.add_row(k, f"{v:.4f}")
    return t
