"""``finetune augment``."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from finetune_cli.augment import DEFAULT_BACKWARD, DEFAULT_FORWARD
from finetune_cli.cli.common import DeviceOpt, JsonOpt, QuietOpt, View, command
from finetune_cli.ui import UI

BT = "Back-translation"
ED = "Edits (no model)"


@command
def augment(  # long: one parameter per command-line option (Typer)
    ui: UI,
    input: Annotated[str, typer.Option("--input", "-i", help="Data file (tsv, csv, jsonl, json, parquet, txt).")],
    output: Annotated[str, typer.Option("--output", "-o", help="File to write; its extension picks the format.")],
    column: Annotated[Optional[list[str]], typer.Option(
        "--column", "-c", help="Text column to rewrite (name, or 0-based index without a header); twice for "
                               "pairs. Default: text/sentence, or a usual pair such as sentence1+sentence2.")] = None,
    backtranslate: Annotated[bool, typer.Option("--backtranslate", help="Paraphrase by back-translation.",
                                                rich_help_panel=BT)] = False,
    forward_model: Annotated[str, typer.Option("--forward-model", help="Source -> pivot seq2seq model "
                                               "(hub id or folder).", rich_help_panel=BT)] = DEFAULT_FORWARD,
    backward_model: Annotated[str, typer.Option("--backward-model", help="Pivot -> source seq2seq model.",
                                                rich_help_panel=BT)] = DEFAULT_BACKWARD,
    temperature: Annotated[float, typer.Option("--temperature", "-t", help="Sampling temperature; higher = "
                                               "noisier; 0 = beam search.", rich_help_panel=BT)] = 1.0,
    top_k: Annotated[int, typer.Option("--top-k", help="Sample from the k likeliest tokens (0 = all).",
                                       rich_help_panel=BT)] = 0,
    top_p: Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass (1 = off).",
                                         rich_help_panel=BT)] = 1.0,
    num_beams: Annotated[int, typer.Option("--num-beams", help="Beams at temperature 0.", rich_help_panel=BT)] = 4,
    max_length: Annotated[int, typer.Option("--max-length", help="Tokens kept per input, and cap on generated "
                                            "tokens.", rich_help_panel=BT)] = 256,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Sentences per generation batch.",
                                            rich_help_panel=BT)] = 32,
    device: DeviceOpt = "auto",
    delete_words: Annotated[float, typer.Option("--delete-words", help="Drop each word with this probability.",
                                                rich_help_panel=ED)] = 0.0,
    swap_words: Annotated[float, typer.Option("--swap-words", help="Swap each word with a random other one with "
                                              "this probability.", rich_help_panel=ED)] = 0.0,
    delete_one_word: Annotated[bool, typer.Option("--delete-one-word", help="Drop one random word (SimCSE's "
                                                  "comparison).", rich_help_panel=ED)] = False,
    num_return: Annotated[int, typer.Option("--num-return", "-n", help="Variants written per input row.")] = 1,
    seed: Annotated[int, typer.Option("--seed", help="Same seed, same settings -> same output.")] = 42,
    keep_originals: Annotated[bool, typer.Option("--keep-originals", help="Append the original rows after "
                                                 "the augmented ones.")] = False,
    chunk_size: Annotated[int, typer.Option("--chunk-size", help="Input rows per saved chunk (the unit of "
                                            "resume).")] = 1024,
    format: Annotated[str, typer.Option("--format", help="Input format: auto (from the extension), tsv, csv, "
                                        "jsonl, json, parquet, txt.")] = "auto",
    header: Annotated[str, typer.Option("--header", help="Does a tsv/csv input have a header row: auto, yes, "
                                        "no.")] = "auto",
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing output (or a partial "
                                            "run with other settings).")] = False,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Write a noisy copy of a data file: finetune augment --backtranslate -t 0.9 -i train.tsv -o noisy.tsv

    Rerunning an interrupted command continues where it stopped.
    """
    from finetune_cli.augment.backtranslate import SamplingSpec
    from finetune_cli.augment.config import AugmentConfig
    from finetune_cli.augment.edits import EditSpec
    from finetune_cli.pipelines.augment import run_augment

    cfg = AugmentConfig(
        input=input, output=output, columns=tuple(column or ()), format=format, header=header,
        backtranslate=backtranslate, forward_model=forward_model, backward_model=backward_model,
        sampling=SamplingSpec(temperature=temperature, top_k=top_k, top_p=top_p, num_beams=num_beams,
                              max_length=max_length),
        edits=EditSpec(delete_one=delete_one_word, delete_prob=delete_words, swap_prob=swap_words),
        num_return=num_return, seed=seed, keep_originals=keep_originals, batch_size=batch_size,
        chunk_size=chunk_size, device=device)
    res = run_augment(cfg, ui, overwrite=overwrite)
    return View(res.to_dict(), lambda ui: _render(res, ui))


def _render(res, ui: UI) -> None:
    from rich.table import Table

    t = Table(title=f"augment ({res.method}) -> {res.output}", show_header=False)
    t.add_row("rows in", str(res.rows_in))
    t.add_row("rows written", f"{res.rows_written} ({res.variants_per_row} per input"
              f"{' + originals' if res.originals_appended else ''})")
    t.add_row("fraction changed", f"{res.fraction_changed:.3f}")
    t.add_row("mean chrF vs input", f"{res.chrf_mean:.1f}")
    if res.chunks_resumed:
        t.add_row("chunks resumed", f"{res.chunks_resumed}/{res.chunks}")
    t.add_row("seconds", f"{res.seconds:.1f}")
    ui.print(t)
    for ex in res.examples:
        ui.log(f"  {ex['input']}\n  -> {ex['output']}")
