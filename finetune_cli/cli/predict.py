"""``finetune predict``."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from finetune_cli.cli.common import (
    CudaGraphsOpt,
    DeviceOpt,
    JsonOpt,
    PrecisionOpt,
    QuietOpt,
    StrideOpt,
    ThresholdOpt,
    View,
    command,
)
from finetune_cli.ui import UI


@command
def predict_cmd(
    ui: UI,
    model: Annotated[str, typer.Argument(help="Run directory, saved model folder, any transformers "
                                              "*ForSequenceClassification folder, or hub id.")],
    input: Annotated[str, typer.Option("--input", "-i", help="Rows to classify: .csv, .tsv, .jsonl, .json or .parquet.")],
    output: Annotated[str, typer.Option("--output", "-o", help="Where to write them with their predictions "
                                                               "(format by extension: csv, tsv, jsonl, json, parquet).")],
    column: Annotated[str, typer.Option("--column", "-c", help="Text column.")] = "text",
    pair_column: Annotated[Optional[str], typer.Option("--pair-column", help="Second text column (sentence pairs).")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1)] = 64,
    max_length: Annotated[Optional[int], typer.Option("--max-length", min=1, help="Default: the length the model was trained with, else 512.")] = None,
    truncation: Annotated[Optional[str], typer.Option(
        "--truncation", help="head | tail | head_tail: which tokens a row longer than the length keeps (head_tail: "
                             "the first quarter and the last three quarters). Default: the model's training rule.")] = None,
    stride: StrideOpt = None,
    threshold: ThresholdOpt = None,
    device: DeviceOpt = "auto",
    precision: PrecisionOpt = "auto",
    cuda_graphs: CudaGraphsOpt = "off",
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Predict every row of a file: the label and each label's probability (the score for
    regression, the label set for multi-label), with all input columns carried through."""
    from finetune_cli.pipelines.predict import run_predict

    res = run_predict(model, input, output, ui, column=column, pair_column=pair_column, batch_size=batch_size,
                      max_length=max_length, device=device, precision=precision, truncation=truncation, stride=stride, cuda_graphs=cuda_graphs,
                      threshold=threshold)
    counts = ", ".join(f"{k} {v}" for k, v in sorted(res.predicted.items()))
    return View(res.to_dict(), lambda ui: ui.print(
        f"wrote {res.output} ({res.rows} rows, {res.problem_type})" + (f": {counts}" if counts else "")))
