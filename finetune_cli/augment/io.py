"""Reading and writing ``finetune augment`` files: any column layout in, the same layout out.

Input: CSV/TSV (header sniffed or given, or 0-based columns), JSONL/JSON, Parquet, TXT, every
column kept. Output: the same columns in the same format and layout (a header or none; or the format
the output's extension names), written atomically by the one table writer (``data.table_io``). Work
happens in chunks of input rows saved as ``<output>.parts/chunk-N.jsonl``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from finetune_cli.data.sources import CONVERT_HINT, Table, TableFile, open_table
from finetune_cli.data.table_io import table_writer
from finetune_cli.errors import DataError

# Column names tried, in order, when --column is not given (pairs first).
KNOWN_PAIRS = (("sentence1", "sentence2"), ("text", "text_pair"), ("premise", "hypothesis"),
               ("question1", "question2"), ("sentence_A", "sentence_B"), ("question", "sentence"))
KNOWN_SINGLE = ("text", "sentence")


@dataclass
class InputData:
    names: list[str]  # every column, in file order
    table: Table
    text_columns: tuple[str, ...]
    has_header: bool
    format: str

    @property
    def columns(self) -> dict[str, list[Any]]:
        return self.table.columns

    def __len__(self) -> int:
        return len(self.columns[self.names[0]])


def _pick_columns(names: list[str], src: str) -> tuple[str, ...]:
    for pair in KNOWN_PAIRS:
        if all(c in names for c in pair):
            return pair
    for c in KNOWN_SINGLE:
        if c in names:
            return (c,)
    raise DataError(f"no --column given and none of the usual text columns in {src} (columns: "
                    f"{', '.join(names[:12])}); pass --column NAME (twice for pairs)")


def _open(src: str, fmt: str, wanted: tuple[str, ...], header: str) -> TableFile:
    """The input opened with the table reader; a CSV/TSV file has a header (``header=auto``) when it
    holds the named columns, or a usual text column when none is named."""
    usual = KNOWN_SINGLE + tuple(c for p in KNOWN_PAIRS for c in p)
    tf = open_table(src, fmt, header if header != "auto" or wanted else "no", hint=CONVERT_HINT, expect=wanted)
    if tf.fmt in ("csv", "tsv") and header == "auto" and not wanted:
        first = [c[0] for c in next(tf.chunks(1, [str(i) for i in range(len(tf.names))])).columns.values()]
        if any(c in first for c in usual):
            return open_table(src, fmt, "yes", hint=CONVERT_HINT)
        raise DataError(f"no --column given and none of the usual text columns in {src} (first row: "
                        f"{', '.join(first[:12])}); pass --column NAME, or a 0-based index for a file without header")
    return tf


def read_input(src: str, fmt: str = "auto", columns: tuple[str, ...] = (), header: str = "auto") -> InputData:
    """Read every column of the input with the table reader; the text columns (``columns``, or the
    usual text columns when none are named) must hold a text in every row."""
    wanted = tuple(columns)
    tf = _open(src, fmt, wanted, header)
    if tf.fmt == "txt" and wanted and wanted != ("text",):
        raise DataError(f"{src} is plain text (one sentence a line): its only column is `text`")
    keys = tuple(tf.key(c) for c in wanted) if wanted else _pick_columns(tf.names, src)
    if len(set(keys)) != len(keys):
        raise DataError(f"--column names the same column twice: {', '.join(wanted)}")
    names, rows = tf.survey(None, keys, shown=wanted or keys)
    if rows == 0:
        raise DataError(f"data file {src} has no rows")
    table = tf.read({n: n for n in names}, optional=set(names) - set(keys))
    return InputData(names, table, keys, tf.has_header, tf.fmt)


def file_digest(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# ---- chunks ----------------------------------------------------------------------------------------

def parts_dir(output: Path) -> Path:
    return output.parent / f"{output.name}.parts"


def chunk_path(parts: Path, k: int) -> Path:
    return parts / f"chunk-{k:06d}.jsonl"


def chunk_seed(seed: int, k: int) -> int:
    """Each chunk's own seed, so a resumed run samples what an uninterrupted one would."""
    return int(hashlib.sha256(f"{seed}:{k}".encode()).hexdigest()[:15], 16)


def read_chunk(path: Path, start: int, stop: int, n_cols: int, n_ret: int) -> Optional[list[dict]]:
    """The chunk's records, or None when it is missing or not exactly rows ``start..stop-1``."""
    if not path.is_file():
        return None
    try:
        recs = [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    if [r.get("row") for r in recs] != list(range(start, stop)):
        return None
    for r in recs:
        if len(r.get("out", ())) != n_ret or any(len(v) != n_cols for v in r["out"]):
            return None
    return recs


def _output_chunks(data: InputData, parts: Path, n_chunks: int) -> Iterator[tuple[list[int], dict[str, list[Any]]]]:
    """Each chunk's output rows (``num_return`` a row, in input order): the input row each comes from,
    and the columns, every input column carried through and the text columns rewritten."""
    for k in range(n_chunks):
        recs = [json.loads(ln) for ln in chunk_path(parts, k).read_text(encoding="utf-8").splitlines() if ln]
        src = [r["row"] for r in recs for _ in r["out"]]
        cols = {name: [data.columns[name][i] for i in src] for name in data.names}
        for c, name in enumerate(data.text_columns):
            cols[name] = [sides[c] for r in recs for sides in r["out"]]
        yield src, cols


def write_output(data: InputData, parts: Path, n_chunks: int, output: Path, fmt: str, originals: bool,
                 types: Optional[dict[str, Any]] = None) -> tuple[int, list[dict[str, str]]]:
    """Write every chunk's rows (then the input rows, with ``originals``) to ``output`` through the
    table writer, in the input's layout, atomically. Returns the rows written and the first three
    rewritten texts beside their inputs."""
    text = data.text_columns[0]
    names = [text] if fmt == "txt" else data.names
    written, examples = 0, []
    with table_writer(output, names, types, fmt=fmt, header=data.has_header) as write:
        for src, cols in _output_chunks(data, parts, n_chunks):
            examples += [{"input": str(data.columns[text][i]), "output": str(out)}
                         for i, out in zip(src[:3 - len(examples)], cols[text], strict=False)]
            write(cols)
            written += len(src)
        if originals:
            write(data.columns)
            written += len(data)
    return written, examples
