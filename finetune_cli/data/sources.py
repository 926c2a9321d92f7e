"""Reading examples from local files and the Hugging Face hub into a column table.

A :class:`Table` maps *logical* column names (``text``, ``text_pair``, ``label``, …) to lists.
Local TSV files are read without quote processing, as GLUE's are: a stray ``"`` in a sentence is
text, not the start of a quoted field.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from finetune_cli.errors import DataError

PKG_RESOURCES = Path(__file__).resolve().parent.parent / "resources"
Col = Union[str, int]


@dataclass
class Table:
    columns: dict[str, list[Any]]
    source: str
    label_names: Optional[list[str]] = None  # from the source itself (hub ClassLabel)
    row_ids: list[int] = field(default_factory=list)  # 1-based row numbers in the source, for messages

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0

    def select(self, idx: list[int]) -> Table:
        return Table({k: [v[i] for i in idx] for k, v in self.columns.items()}, self.source, self.label_names,
                     [self.row_ids[i] for i in idx] if self.row_ids else [])


DATA_DIR_ENV = "FINETUNE_DATA_DIR"


def resolve_path(path: str) -> Path:
    """``pkg:quickstart/train.tsv`` names a file shipped inside the package; ``data:STS-B/dev.tsv`` a
    file in the data folder (``--data-dir`` / ``$FINETUNE_DATA_DIR``), so a recipe runs unchanged from
    any directory. Any other relative path is relative to the current directory, as on a command line."""
    if path.startswith("pkg:"):
        return PKG_RESOURCES / path[4:]
    if path.startswith("data:"):
        base = os.environ.get(DATA_DIR_ENV)
        if not base:
            raise DataError(f"`{path}` names a file in the data folder: pass --data-dir DIR (or set {DATA_DIR_ENV})")
        return Path(base).expanduser() / path[5:]
    return Path(path).expanduser()


def detect_format(path: Path, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    suffixes = [s.lower() for s in path.suffixes]
    for s in reversed(suffixes):
        if s in (".tsv", ".csv", ".jsonl", ".json", ".parquet", ".txt"):
            return s[1:]
    raise DataError(f"cannot tell the format of {path} from its extension; set data.format (csv, tsv, jsonl, json, parquet, txt)")


ENCODING_HINT = "set data.encoding (e.g. data.encoding=latin-1) or convert the file to UTF-8"
CONVERT_HINT = "convert it to UTF-8 (e.g. iconv -f latin1 -t utf-8 IN > OUT)"


def check_encoding(name: str) -> str:
    """The codec's canonical name, or a one-line error."""
    try:
        return codecs.lookup(name).name
    except LookupError:
        raise DataError(f"unknown text encoding `{name}` (try utf-8, latin-1, cp1252, utf-16)") from None


def decode_file(path: Path, src: str, encoding: str = "utf-8", hint: str = ENCODING_HINT) -> str:
    """The whole file as text. A UTF-8 byte-order mark is dropped (it would otherwise become part of
    the first column's name); undecodable bytes are one error naming the file, the byte offset, the
    row and what to do."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DataError(f"cannot read {src}: {e.strerror or e}") from None
    enc = check_encoding(encoding)
    try:
        return data.decode("utf-8-sig" if enc == "utf-8" else enc)
    except UnicodeDecodeError as e:
        row = data.count(b"\n", 0, e.start) + 1
        bad = data[e.start:e.end][:4].hex(" ")
        raise DataError(f"{src} is not valid {encoding}: byte(s) {bad} at byte offset {e.start} (row {row}); "
                        f"{hint}") from None


def _rows_delimited(text: str, delimiter: str, quoting: bool) -> list[list[str]]:
    f = io.StringIO(text, newline="")
    if quoting:
        return [row for row in csv.reader(f, delimiter=delimiter)]
    return [line.rstrip("\r\n").split(delimiter) for line in f if line.strip("\r\n")]


def _delimited_table(path: Path, path_str: str, fmt: str, wanted: Mapping[str, Col], header: str, encoding: str,
                     hint: str) -> Table:
    rows = _rows_delimited(decode_file(path, path_str, encoding, hint), "\t" if fmt == "tsv" else ",",
                           quoting=(fmt == "csv"))
    if not rows:
        raise DataError(f"data file {path_str} is empty")
    names_wanted = [v for v in wanted.values() if isinstance(v, str)]
    has_header = header == "yes" or (header == "auto" and bool(names_wanted) and all(n in rows[0] for n in names_wanted))
    if header == "auto" and names_wanted and not has_header and not all(v.isdigit() for v in names_wanted):
        missing = [n for n in names_wanted if n not in rows[0]]
        raise DataError(f"missing column `{missing[0]}` in {path_str} (header: {', '.join(rows[0][:12])})")
    head = rows[0] if has_header else []
    body = rows[1:] if has_header else rows
    first_line = 2 if has_header else 1
    idx = {}
    for logical, col in wanted.items():
        if isinstance(col, int) or (isinstance(col, str) and col.isdigit() and col not in head):
            idx[logical] = int(col)
        elif col in head:
            idx[logical] = head.index(col)
        else:
            raise DataError(f"missing column `{col}` in {path_str} (header: {', '.join(head[:12]) or 'none'})")
    need = max(idx.values()) + 1 if idx else 0
    cols: dict[str, list[Any]] = {k: [] for k in idx}
    for n, row in enumerate(body):
        if len(row) < need:
            raise DataError(f"row {n + first_line} of {path_str} has {len(row)} fields, expected at least {need}")
        for k, i in idx.items():
            cols[k].append(row[i])
    return Table(cols, path_str, row_ids=list(range(first_line, first_line + len(body))))


def _json_file_records(path: Path, path_str: str, fmt: str, encoding: str, hint: str) -> list[Any]:
    text = decode_file(path, path_str, encoding, hint)
    if fmt == "jsonl":
        records = []
        for n, line in enumerate(text.split("\n"), 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise DataError(f"malformed JSON in {path_str}: {e.msg} at line {n}, column {e.colno}") from None
    else:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"malformed JSON in {path_str}: {e.msg} at line {e.lineno}") from None
        records = json_records(obj, path_str)
    return records


def read_file(path_str: str, colmap: Mapping[str, Optional[Col]], fmt: str = "auto", header: str = "auto",
              encoding: str = "utf-8", hint: str = ENCODING_HINT) -> Table:
    """Read ``path`` and pick the columns named in ``colmap`` (logical name -> column name or index).

    Columns mapped to None are skipped. A missing file, a missing column, a short row or an empty
    file raise :class:`DataError` naming the file (and the row).
    """
    path = resolve_path(path_str)
    if not path.is_file():
        raise DataError(f"data file not found: {path_str}")
    fmt = detect_format(path, fmt)
    wanted = {k: v for k, v in colmap.items() if v is not None}
    if fmt in ("tsv", "csv"):
        return _delimited_table(path, path_str, fmt, wanted, header, encoding, hint)
    if fmt in ("jsonl", "json"):
        return _from_records(_json_file_records(path, path_str, fmt, encoding, hint), wanted, path_str)
    if fmt == "parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise DataError("reading parquet needs pyarrow (pip install 'finetune-cli[parquet]')") from None
        return _from_records(read_parquet_rows(path, path_str), wanted, path_str)
    if fmt == "txt":
        lines = [line.rstrip("\r\n") for line in io.StringIO(decode_file(path, path_str, encoding, hint), newline=None)]
        lines = [s for s in lines if s.strip()]
        text_col = next(iter(wanted), "text")
        return Table({text_col: lines}, path_str, row_ids=list(range(1, len(lines) + 1)))
    raise DataError(f"unsupported data format `{fmt}` for {path_str}")


def json_records(obj: Any, src: str) -> list[Any]:
    """A JSON file's records: a top-level list, or the list under an object's ``data`` key."""
    records = obj.get("data") if isinstance(obj, dict) and "data" in obj else obj
    if not isinstance(records, list):
        raise DataError(f"{src} must hold a JSON list of records (or an object whose `data` is one); its top "
                        f"level is {'an object' if isinstance(records, dict) else type(records).__name__}")
    return records


def read_parquet_rows(path: Path, src: str) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{src} is not a readable Parquet file ({' '.join(str(e).split())[:160]})") from None


def is_missing(v: Any, words: tuple[str, ...] = ()) -> bool:
    """None, a float NaN, a blank string, or one of ``words`` (e.g. ``nan`` for a label, the way
    pandas writes a missing value): a missing label or text."""
    if v is None:
        return True
    if isinstance(v, float):
        return math.isnan(v)
    if isinstance(v, str):
        return not v.strip() or v.strip().lower() in words
    return False


def _from_records(records: list[Any], wanted: Mapping[str, Col], src: str) -> Table:
    if not records:
        raise DataError(f"data file {src} is empty")
    cols: dict[str, list[Any]] = {k: [] for k in wanted}
    for n, rec in enumerate(records, 1):
        if not isinstance(rec, Mapping):
            raise DataError(f"record {n} of {src} is not an object")
        for logical, col in wanted.items():
            if col not in rec:
                raise DataError(f"missing column `{col}` in record {n} of {src} (keys: {', '.join(map(str, rec))})")
            cols[logical].append(rec[col])
    return Table(cols, src, row_ids=list(range(1, len(records) + 1)))


def read_hub(name: str, config: Optional[str], split: str, colmap: Mapping[str, Optional[Col]]) -> Table:
    """Load ``split`` of a hub dataset with ``datasets.load_dataset``."""
    try:
        import datasets
    except ImportError:  # pragma: no cover
        raise DataError("hub datasets need the `datasets` package") from None
    src = f"{name}{':' + config if config else ''}[{split}]"
    try:
        ds = datasets.load_dataset(name, config, split=split)
    except Exception as e:  # datasets raises many types (ConnectionError, DatasetNotFoundError, ValueError…)
        msg = " ".join(str(e).split())[:200]
        raise DataError(f"cannot load hub dataset {src} (offline, or no such dataset/split? pass --data-dir for a "
                        f"local GLUE folder or use data.train/data.eval files): {msg}") from None
    wanted = {k: v for k, v in colmap.items() if v is not None}
    cols = {}
    for logical, col in wanted.items():
        if col not in ds.column_names:
            raise DataError(f"missing column `{col}` in hub dataset {src} (columns: {', '.join(ds.column_names)})")
        cols[logical] = list(ds[col])
    label_names = None
    lab = wanted.get("label")
    if lab is not None:
        feat = ds.features.get(lab)
        label_names = list(getattr(feat, "names", None) or []) or None
    if label_names:  # ClassLabel ids -> names, so local and hub copies of a task agree
        cols["label"] = [label_names[i] if isinstance(i, int) and 0 <= i < len(label_names) else i
                         for i in cols["label"]]
    return Table(cols, src, label_names=label_names, row_ids=list(range(1, len(ds) + 1)))
