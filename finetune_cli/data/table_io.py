"""Whole tables in and out (every column), by file extension: CSV, TSV, JSONL, Parquet.

``finetune predict`` reads an input file with all its columns and writes them back with the
predictions appended. TSV is read without quote processing (as GLUE's files are, see
``sources.py``); CSV with the csv module's quoting.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from finetune_cli.data.sources import detect_format, resolve_path
from finetune_cli.errors import DataError

FORMATS = ("csv", "tsv", "jsonl", "parquet")


def table_format(path: str | Path) -> str:
    fmt = detect_format(Path(path), "auto")
    if fmt == "json":
        fmt = "jsonl"
    if fmt not in FORMATS:
        raise DataError(f"{path}: use a .csv, .tsv, .jsonl or .parquet file")
    return fmt


def read_columns(path_str: str) -> dict[str, list[Any]]:
    """Every column of a file with a header (CSV/TSV) or of its records (JSONL/Parquet), in order."""
    path = resolve_path(path_str)
    if not path.is_file():
        raise DataError(f"input file not found: {path_str}")
    fmt = table_format(path)
    if fmt in ("csv", "tsv"):
        with path.open(encoding="utf-8", newline="") as f:
            if fmt == "csv":
                rows = list(csv.reader(f))
            else:
                rows = [ln.rstrip("\r\n").split("\t") for ln in f if ln.strip("\r\n")]
        if len(rows) < 2:
            raise DataError(f"{path_str} has no rows under its header")
        head = rows[0]
        cols: dict[str, list[Any]] = {h: [] for h in head}
        for n, row in enumerate(rows[1:], 2):
            if len(row) != len(head):
                raise DataError(f"row {n} of {path_str} has {len(row)} fields, its header {len(head)}")
            for h, v in zip(head, row, strict=True):
                cols[h].append(v)
        return cols
    if fmt == "jsonl":
        try:
            records = [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
        except json.JSONDecodeError as e:
            raise DataError(f"malformed JSON in {path_str}: {e.msg} at line {e.lineno}") from None
    else:
        import pyarrow.parquet as pq

        records = pq.read_table(path).to_pylist()
    if not records:
        raise DataError(f"{path_str} has no rows")
    keys: dict[str, None] = {}
    for r in records:
        if not isinstance(r, dict):
            raise DataError(f"{path_str}: every JSONL line must be an object")
        keys.update(dict.fromkeys(r))
    return {k: [r.get(k) for r in records] for k in keys}


def write_columns(path_str: str, cols: dict[str, list[Any]]) -> None:
    """Write columns (lists of equal length) to ``path_str`` in the format its extension names.
    In CSV/TSV a list value is joined with ``,``."""
    path = Path(path_str)
    fmt = table_format(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    names = list(cols)
    n = len(next(iter(cols.values()))) if cols else 0
    if fmt in ("csv", "tsv"):
        def cell(v: Any) -> str:
            if isinstance(v, (list, tuple)):
                return ",".join(map(str, v))
            return "" if v is None else str(v)

        with path.open("w", encoding="utf-8", newline="") as f:
            if fmt == "csv":
                w = csv.writer(f)
                w.writerow(names)
                for i in range(n):
                    w.writerow([cell(cols[k][i]) for k in names])
            else:
                f.write("\t".join(names) + "\n")
                for i in range(n):
                    f.write("\t".join(cell(cols[k][i]).replace("\t", " ").replace("\n", " ") for k in names) + "\n")
    elif fmt == "jsonl":
        with path.open("w", encoding="utf-8") as f:
            for i in range(n):
                f.write(json.dumps({k: cols[k][i] for k in names}, ensure_ascii=False) + "\n")
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({k: cols[k] for k in names}), path)
