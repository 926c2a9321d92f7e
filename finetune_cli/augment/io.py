"""Reading and writing ``finetune augment`` files: any column layout in, the same layout out.

Input: CSV/TSV (header sniffed or given, or 0-based columns), JSONL/JSON, Parquet, TXT, every
column kept. Output: the same columns in the same format (or the one the output's extension names),
written atomically. Work happens in chunks of input rows saved as ``<output>.parts/chunk-N.jsonl``.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from finetune_cli.data.sources import CONVERT_HINT, TableFile, open_table
from finetune_cli.errors import DataError
from finetune_cli.fsutil import atomic_file, atomic_write_text

# Column names tried, in order, when --column is not given (pairs first).
KNOWN_PAIRS = (("sentence1", "sentence2"), ("text", "text_pair"), ("premise", "hypothesis"),
               ("question1", "question2"), ("sentence_A", "sentence_B"), ("question", "sentence"))
KNOWN_SINGLE = ("text", "sentence")
OUTPUT_FORMATS = ("tsv", "csv", "jsonl", "json", "parquet", "txt")


@dataclass
class InputData:
    names: list[str]  # every column, in file order
    columns: dict[str, list[Any]]
    text_columns: tuple[str, ...]
    has_header: bool
    format: str

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
    return InputData(names, table.columns, keys, tf.has_header, tf.fmt)


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


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


def _clean(v: Any) -> str:
    return " ".join(str(v).split()) if isinstance(v, str) else ("" if v is None else str(v))


def output_rows(data: InputData, parts: Path, n_chunks: int) -> Iterator[dict[str, Any]]:
    for k in range(n_chunks):
        for rec in (json.loads(ln) for ln in chunk_path(parts, k).read_text(encoding="utf-8").splitlines() if ln):
            i = rec["row"]
            for sides in rec["out"]:
                row = {name: data.columns[name][i] for name in data.names}
                row.update(zip(data.text_columns, sides, strict=True))
                yield row


def write_output(rows: list[dict[str, Any]], data: InputData, output: Path, fmt: str) -> None:
    """Write all rows to a temporary sibling, then rename it over ``output`` (atomic)."""
    names = data.names
    if fmt in ("tsv", "txt"):
        buf = io.StringIO()
        if fmt == "txt":
            for r in rows:
                buf.write(_clean(r[data.text_columns[0]]) + "\n")
        else:
            if data.has_header:
                buf.write("\t".join(names) + "\n")
            for r in rows:
                buf.write("\t".join(_clean(r[n]) for n in names) + "\n")
        atomic_write_text(output, buf.getvalue())
    elif fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        if data.has_header:
            w.writerow(names)
        for r in rows:
            w.writerow([r[n] for n in names])
        atomic_write_text(output, buf.getvalue())
    elif fmt == "jsonl":
        atomic_write_text(output, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    elif fmt == "json":
        atomic_write_text(output, json.dumps(rows, ensure_ascii=False, indent=1) + "\n")
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        with atomic_file(output) as tmp:
            pq.write_table(pa.Table.from_pylist(rows), tmp)
