"""``finetune export``."""

from __future__ import annotations

from typing import Annotated

import typer

from finetune_cli.cli.common import JsonOpt, QuietOpt, View, command
from finetune_cli.ui import UI


@command
def export_cmd(
    ui: UI,
    model: Annotated[str, typer.Argument(help="Run directory or saved model folder (a LoRA adapter folder too).")],
    output: Annotated[str, typer.Option("--output", "-o", help="Folder to write.")],
    format: Annotated[str, typer.Option("--format", "-f", help="transformers (with --merge) or onnx.")] = "transformers",
    merge: Annotated[bool, typer.Option("--merge", help="Fold a LoRA adapter into the weights: a plain "
                                                        "transformers / sentence-transformers folder.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a non-empty output folder.")] = False,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Export a model: a LoRA adapter merged into a plain transformers folder (--merge), or any
    classifier or embedding model as ONNX (--format onnx, dynamic batch and length) that
    `finetune predict`, `eval` and `embed` run in onnxruntime."""
    from finetune_cli.pipelines.export import run_export

    res = run_export(model, output, ui, fmt=format, merge=merge, overwrite=overwrite)
    return View(res.to_dict(), lambda ui: ui.print(f"wrote {res.output} ({res.format}: {', '.join(res.outputs)})"))
