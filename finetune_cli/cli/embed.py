"""``finetune embed``."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from finetune_cli.cli.common import (
    CudaGraphsOpt,
    DeviceOpt,
    JsonOpt,
    ModelArg,
    PrecisionOpt,
    QuietOpt,
    View,
    command,
)
from finetune_cli.errors import FinetuneError
from finetune_cli.ui import UI


@command
def embed_cmd(
    ui: UI,
    model: ModelArg,
    input_arg: Annotated[Optional[str], typer.Argument(
        metavar="INPUT", help="The sentences, as a positional argument (same as --input).", show_default=False)] = None,
    input: Annotated[Optional[str], typer.Option(
        "--input", "-i", help="Sentences: a .txt file (one per line) or a csv, tsv, jsonl or parquet file.",
        show_default=False)] = None,
    output: Annotated[str, typer.Option(
        "--output", "-o", help="Output .npy (+ .ids.npy with the row ids: 1 for the first data row, in every format) "
                               "or .parquet.", show_default=False)] = ...,
    column: Annotated[Optional[str], typer.Option("--column", "-c", help="Column to embed (name or 0-based index; default: text).")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1)] = 64,
    max_length: Annotated[Optional[int], typer.Option("--max-length", min=1, help="Default: the max_seq_length of a folder saved by Sentence Transformers, else the length the model was trained with, else 512.")] = None,
    normalize: Annotated[Optional[bool], typer.Option("--normalize/--no-normalize", help="L2-normalise the embeddings. Default: as the modules of a folder saved by Sentence Transformers say (a Normalize module), else no.", show_default=False)] = None,
    device: DeviceOpt = "auto",
    precision: PrecisionOpt = "auto",
    cuda_graphs: CudaGraphsOpt = "off",
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Embed sentences with a model's pooled output (batched, longest first); a sentence-transformers
    folder is embedded as ``SentenceTransformer(folder).encode`` does."""
    from finetune_cli.pipelines.embed import run_embed

    if (input is None) == (input_arg is None):
        raise FinetuneError("finetune embed: give the sentences once, as --input FILE (or as the argument after "
                            "the model)" if input is None else "finetune embed: the sentences are given twice "
                            f"({input_arg} and --input {input}); keep one")
    res = run_embed(model, input or input_arg or "", output, ui, column=column, batch_size=batch_size, max_length=max_length,
                    normalize=normalize, device=device, precision=precision, cuda_graphs=cuda_graphs)
    return View(res.to_dict(), lambda ui: ui.print(
        f"wrote {res.output} ({res.sentences} x {res.dim})" + (f" and {res.ids_file}" if res.ids_file else "")))
