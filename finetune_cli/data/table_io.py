"""Writing tables in chunks: CSV, TSV, JSONL, JSON, Parquet or TXT by the output's extension.

``finetune predict`` writes every input column back with its predictions appended, one chunk of
rows at a time, and ``finetune augment`` its rewritten rows (the reader is ``sources.open_table``).
The rows go to a temporary sibling of the output that is renamed over it at the end
(``fsutil.atomic_file``): a failed or interrupted run leaves nothing under the output's name. In
CSV/TSV a list value is joined with ``,``; a TSV or TXT cell has its tabs and line breaks made spaces,
so every row stays one line.
"""

from __future__ import annotations

import contextlib
import csv
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from finetune_cli.data.sources import Table, resolve_path
from finetune_cli.errors import DataError, error_text
from finetune_cli.fsutil import atomic_file, check_apart, check_output_file

# table_writer writes every format the reader reads (``sources.FORMATS``). TXT (one text a line, no
# header) holds one column; a JSON file is one array of records, a JSONL file one record a line.
TABLE_FORMATS = ("csv", "tsv", "jsonl", "json", "parquet")  # those that hold any columns


def table_format(path: str | Path, default: Optional[str] = None, formats: Sequence[str] = TABLE_FORMATS,
                 what: str = "--output") -> str:
    """The format ``path``'s extension names (``default`` when it has none), one of ``formats``."""
    suffix = Path(path).suffix
    fmt = suffix[1:].lower() if suffix else (default or "")
    if fmt not in formats:
        why = f"unknown output format `{suffix}`" if suffix else "no extension names its format"
        raise DataError(f"cannot write {path}: {why}; end {what} in .{', .'.join(formats)}")
    return fmt


def check_table_output(output: str | Path, input_path: Optional[str] = None, what: str = "--output",
                       default: Optional[str] = None, formats: Sequence[str] = TABLE_FORMATS) -> str:
    """Everything about an output file that can be known before any work: its format (one of
    ``formats``, by extension, else ``default``), that it can be written (not a folder, not under a
    file, its folder writable; pyarrow for Parquet) and that it is not the input. Returns the format."""
    fmt = table_format(output, default, formats, what)
    check_output_file(output, what)
    if fmt == "parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise DataError(f"writing {output} needs pyarrow (pip install 'finetune-cli[parquet]')") from None
    if input_path is not None:
        check_apart(output, [("input file", resolve_path(input_path))], what)
    return fmt


def _kind(v: Any) -> Optional[str]:
    if v is None:
        return None
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    return {str: "text", list: "list", tuple: "list", dict: "object"}.get(type(v), type(v).__name__)


class ColumnTypes:
    """The type of each column over every chunk (:meth:`add`), for a Parquet output, which holds
    one type per column: a column of numbers and texts is refused before any work is done,
    naming the column and a row of each."""

    def __init__(self) -> None:
        self.seen: dict[str, dict[str, int]] = {}  # column -> kind -> first row with it
        self.floats: set[str] = set()

    def add(self, chunk: Table) -> None:
        for name, values in chunk.columns.items():
            kinds = self.seen.setdefault(name, {})
            for i, v in enumerate(values):
                k = _kind(v)
                if k is not None and k not in kinds:
                    kinds[k] = chunk.row(i)
                    if len(kinds) > 1:
                        (a, ra), (b, rb) = list(kinds.items())[:2]
                        raise DataError(f"column `{name}` of {chunk.source} holds {a} (row {ra}) and {b} (row {rb}); "
                                        f"a Parquet column holds one type: write .jsonl or .csv, or make them one")
                if k == "number" and isinstance(v, float):
                    self.floats.add(name)

    def arrow_types(self) -> dict[str, Any]:
        """The Parquet type of every scalar column (None-only columns are left to the first chunk)."""
        import pyarrow as pa

        simple = {"bool": pa.bool_(), "text": pa.string()}
        out = {}
        for name, kinds in self.seen.items():
            if "number" in kinds:
                out[name] = pa.float64() if name in self.floats else pa.int64()
            elif len(kinds) == 1 and next(iter(kinds)) in simple:
                out[name] = simple[next(iter(kinds))]
        return out


def _cell(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return ",".join(map(str, v))
    return "" if v is None else str(v)


_ONE_LINE = str.maketrans("\t\r\n", "   ")  # a TSV/TXT cell: no tab or line break splits the row


@contextlib.contextmanager
def _sink(fmt: str, tmp: Path, names: Sequence[str], types: Mapping[str, Any], header: bool
          ) -> Iterator[Callable[[dict], None]]:
    """``write(columns)`` appending rows to ``tmp``; the file is closed (flushed) on the way out."""
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        writer: list[Any] = []

        def write_parquet(cols: dict) -> None:
            try:
                if not writer:  # columns of no known type take the first chunk's
                    inferred = pa.table({k: cols[k] for k in names if k not in types})
                    writer.append(pq.ParquetWriter(tmp, pa.schema(
                        [(k, types[k] if k in types else inferred.schema.field(k).type) for k in names])))
                writer[0].write_table(pa.Table.from_pydict({k: cols[k] for k in names}, schema=writer[0].schema))
            except (pa.ArrowException, TypeError, ValueError) as e:
                raise DataError(f"cannot write these rows as Parquet ({error_text(e, 160)}); "
                                f"write .jsonl or .csv") from None
        try:
            yield write_parquet
        finally:
            if writer:
                writer[0].close()
        return
    def rows(cols: dict) -> Iterator[tuple]:
        return zip(*[cols[k] for k in names], strict=True)

    def records(cols: dict, indent: Optional[int] = None) -> Iterator[str]:
        return (json.dumps(dict(zip(names, row, strict=True)), ensure_ascii=False, indent=indent) for row in rows(cols))

    with tmp.open("w", encoding="utf-8", newline="") as f:
        if fmt == "csv":
            w = csv.writer(f)
            if header:
                w.writerow(names)
            yield lambda cols: w.writerows([_cell(v) for v in row] for row in rows(cols))
        elif fmt in ("tsv", "txt"):
            if header and fmt == "tsv":
                f.write("\t".join(names) + "\n")
            yield lambda cols: f.writelines("\t".join(_cell(v).translate(_ONE_LINE) for v in row) + "\n"
                                            for row in rows(cols))
        elif fmt == "jsonl":
            yield lambda cols: f.writelines(r + "\n" for r in records(cols))
        else:  # one JSON array, laid out as json.dumps(records, indent=1) lays it out
            empty = True

            def write_json(cols: dict) -> None:
                nonlocal empty
                for r in records(cols, indent=1):
                    f.write(("[\n " if empty else ",\n ") + r.replace("\n", "\n "))
                    empty = False
            yield write_json
            f.write("[]\n" if empty else "\n]\n")


@contextlib.contextmanager
def table_writer(path: str | Path, names: Sequence[str], types: Optional[Mapping[str, Any]] = None,
                 fmt: Optional[str] = None, header: bool = True) -> Iterator[Callable[[dict[str, list[Any]]], None]]:
    """Yield ``write(columns)``, called once per chunk (lists of equal length, keyed by ``names``).
    The rows go to a temporary sibling renamed over ``path`` when the block ends; if it raises (or
    is interrupted) the temporary file is removed and nothing is left under ``path``. ``types``:
    the Parquet type of columns whose first chunk may not show it (e.g. a list that is empty).
    ``fmt``: the format (from :func:`check_table_output`; else ``path``'s extension); ``header``:
    whether a CSV/TSV file starts with the column names (TXT has none)."""
    fmt = fmt or table_format(path)
    with atomic_file(path) as tmp, _sink(fmt, tmp, list(names), dict(types or {}), header) as write:
        yield write
