"""``finetune report``."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from finetune_cli.cli.common import JsonOpt, View, command
from finetune_cli.ui import UI


@command
def report_cmd(
    ui: UI,
    run_dirs: Annotated[list[str], typer.Argument(
        help="Run directories (or folders of seed-*/ runs), e.g. runs/ce runs/scl.", show_default=False)],
    compare: Annotated[Optional[list[str]], typer.Option(
        "--compare", help="A,B: paired comparison of recipe A against B over shared seeds (repeatable). "
                          "Default with exactly two recipes: the second against the first.")] = None,
    markdown: Annotated[bool, typer.Option("--markdown", help="Print Markdown tables on stdout.")] = False,
    plot: Annotated[Optional[str], typer.Option(
        "--plot", help="PNG box plot path (default: report.png beside the runs).")] = None,
    no_plot: Annotated[bool, typer.Option("--no-plot", help="Do not write the PNG.")] = False,
    curves: Annotated[Optional[str], typer.Option(
        "--curves", help="Also draw every run's training curves into this PNG (seeds thin, recipe mean bold).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Mean ± std per metric per recipe over seeds, and paired comparisons (t-test, Wilcoxon)."""
    from pathlib import Path

    from finetune_cli.pipelines.report import build_report, default_plot_path

    out = None if no_plot else (Path(plot) if plot else default_plot_path(run_dirs))
    rep = build_report(run_dirs, compare or [], plot=out)
    curves_png = None
    if curves:
        from finetune_cli.viz.curves import single_point_panels
        from finetune_cli.viz.report_curves import report_curves

        curves_png, drawn = report_curves(rep, Path(curves))
        once = single_point_panels(drawn)
        if once:
            ui.warn(f"--curves: every run logged {', '.join(once)} once (a run shorter than train.log_every / "
                    "train.eval_every): points, not curves; lower those, or set train.min_evals, for curves")
    return View({**rep.to_dict(), **({"curves": str(curves_png)} if curves_png else {})},
                lambda ui: _render(rep, markdown, curves_png, ui))


def _render(rep, markdown: bool, curves_png, ui: UI) -> None:
    if markdown:
        from finetune_cli.cli.report_render import to_markdown

        typer.echo(to_markdown(rep), nl=False)
    else:
        from finetune_cli.cli.report_render import render_report

        render_report(ui, rep)
    for note in rep.notes:
        ui.warn(note)
    if rep.plot:
        ui.log(f"plot: {rep.plot}")
    if curves_png:
        ui.log(f"curves: {curves_png}")
