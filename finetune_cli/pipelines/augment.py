"""``finetune augment``: write a noisy copy of a data file by back-translation or simple edits.

Every column other than the rewritten text column(s) is carried through unchanged; each input row
becomes ``num_return`` output rows (in input order), optionally followed by the original rows.

Crash safety and resume: work happens in chunks of ``chunk_size`` input rows. Each finished chunk
is written atomically to ``<output>.parts/chunk-NNNNNN.jsonl`` next to a ``manifest.json`` that
records every setting that changes the output plus a digest of the input. A rerun with the same
settings skips the chunks already on disk (each chunk's RNG is seeded from ``(seed, chunk)``, so a
resumed run writes exactly what an uninterrupted one would); the final file is assembled into a
temporary file and renamed over ``output`` in one step, then the parts folder is removed. Bad
input (options, columns, models) is rejected before the parts folder is created.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from finetune_cli.augment import AugmentOptionError
from finetune_cli.augment.chunks import chrf_metric, chunk_summary, compute_chunk
from finetune_cli.augment.config import AugmentConfig, validate
from finetune_cli.augment.io import (
    InputData,
    chunk_path,
    file_digest,
    parts_dir,
    read_chunk,
    read_input,
    write_output,
)
from finetune_cli.data.sources import FORMATS, resolve_path
from finetune_cli.data.table_io import ColumnTypes, check_table_output
from finetune_cli.errors import RunDirError
from finetune_cli.fsutil import atomic_write_json, atomic_write_text, check_apart, clean_stale_temps
from finetune_cli.rundir import same_job

MANIFEST = "manifest.json"


@dataclass
class AugmentResult:
    input: str
    output: str
    method: str
    columns: list[str]
    rows_in: int
    rows_written: int
    variants_per_row: int
    originals_appended: bool
    fraction_changed: float
    chrf_mean: float
    chunks: int
    chunks_resumed: int
    seconds: float
    device: Optional[str]
    settings: dict[str, Any]
    examples: list[dict[str, str]]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---- the pipeline ------------------------------------------------------------------------------------

def run_augment(cfg: AugmentConfig, ui, overwrite: bool = False) -> AugmentResult:
    t0 = time.perf_counter()
    validate(cfg)
    data = read_input(cfg.input, cfg.format, tuple(cfg.columns), cfg.header)
    out, out_fmt, types = _check_output(cfg, data)
    parts = parts_dir(out)
    check_apart(parts, [("input file", resolve_path(cfg.input))], "work folder")  # it is deleted at the end
    n = len(data)
    n_chunks = (n + cfg.chunk_size - 1) // cfg.chunk_size
    manifest = {"input": cfg.input, "input_file": {"sha256": file_digest(resolve_path(cfg.input)), "rows": n},
                "chunks": n_chunks, "settings": cfg.settings(data.text_columns)}
    old = _read_manifest(parts) if parts.is_dir() else None
    resume = old is not None and same_job(parts, _comparable(old), _comparable(manifest), kind="augment run",
                                          overwrite=overwrite, remedy="pass --overwrite to start again")
    if not resume and out.exists() and not overwrite:
        raise RunDirError(f"output {cfg.output} already exists; pass --overwrite to replace it")
    translator, device = _load_translator(cfg, ui)
    chrf = chrf_metric()
    # Nothing was written before this point: every check above fails with parts/ and output untouched.
    if parts.is_dir() and not resume:
        shutil.rmtree(parts)
    parts.mkdir(parents=True, exist_ok=True)
    clean_stale_temps(parts)
    if not resume:
        atomic_write_json(parts / MANIFEST, manifest)
    resumed = _run_chunks(cfg, data, parts, n_chunks, translator, chrf, ui)
    if resumed:
        ui.log(f"resumed: {resumed} of {n_chunks} chunks were already done in {parts}")
    changed, chrf_mean = chunk_summary(data, parts, n_chunks)
    rows_written, examples = write_output(data, parts, n_chunks, out, out_fmt, cfg.keep_originals, types)
    shutil.rmtree(parts, ignore_errors=True)
    return AugmentResult(
        input=cfg.input, output=str(out), method=cfg.method, columns=list(data.text_columns), rows_in=n,
        rows_written=rows_written, variants_per_row=cfg.num_return, originals_appended=cfg.keep_originals,
        fraction_changed=changed, chrf_mean=chrf_mean, chunks=n_chunks, chunks_resumed=resumed,
        seconds=time.perf_counter() - t0, device=device, settings=manifest["settings"], examples=examples)


def _check_output(cfg: AugmentConfig, data: InputData) -> tuple[Path, str, Optional[dict[str, Any]]]:
    """The output path, its format (the input's when its name has no extension) and a Parquet
    output's column types, checked before anything is computed."""
    out = Path(cfg.output).expanduser()
    out_fmt = check_table_output(out, cfg.input, "--output", default=data.format, formats=FORMATS)
    if out_fmt == "txt" and len(data.text_columns) > 1:
        raise AugmentOptionError(f"cannot write pairs to the plain-text file {cfg.output}; use .tsv, .csv or .jsonl")
    types = None
    if out_fmt == "parquet":  # the input's column types (a rewritten text is a text): a mixed column is refused now
        seen = ColumnTypes()
        seen.add(data.table)
        types = seen.arrow_types()
    return out, out_fmt, types


def _load_translator(cfg: AugmentConfig, ui):
    if not cfg.backtranslate:
        return None, None
    from finetune_cli.augment.backtranslate import BackTranslator
    from finetune_cli.engine.device import resolve_device

    dev = resolve_device(cfg.device)
    ui.log(f"loading {cfg.forward_model} and {cfg.backward_model} on {dev}")
    return BackTranslator.load(cfg.forward_model, cfg.backward_model, cfg.sampling, dev, cfg.batch_size), str(dev)


def _run_chunks(cfg: AugmentConfig, data: InputData, parts: Path, n_chunks: int, translator, chrf, ui) -> int:
    """Compute and write every chunk not already on disk; returns how many were."""
    n, resumed = len(data), 0
    with ui.progress(n, f"augment ({cfg.method})") as prog:
        for k in range(n_chunks):
            start, stop = k * cfg.chunk_size, min(n, (k + 1) * cfg.chunk_size)
            cp = chunk_path(parts, k)
            if read_chunk(cp, start, stop, len(data.text_columns), cfg.num_return) is not None:
                resumed += 1
            else:
                # Within a chunk: texts generated so far (forward, then backward pass) as the bar's note.
                stage_total = (stop - start) * len(data.text_columns) * (1 + cfg.num_return)
                seen = [0]

                def tick(m: int, k=k, start=start, stage_total=stage_total, seen=seen) -> None:
                    seen[0] += m
                    prog.update(start, f"chunk {k + 1}/{n_chunks}: {seen[0]}/{stage_total} generations")

                recs = compute_chunk(cfg, data, start, stop, k, translator, chrf, tick)
                atomic_write_text(cp, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs))
            prog.update(stop, f"chunk {k + 1}/{n_chunks}", force_line=True)
    return resumed


def _read_manifest(parts: Path) -> Optional[dict]:
    try:
        return json.loads((parts / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def _comparable(m: dict) -> dict:
    return {k: v for k, v in m.items() if k != "input"}  # the same file named another way is the same input
