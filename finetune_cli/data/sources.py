"""The one table reader: local files (and Hugging Face hub datasets) into column tables.

Every command that reads rows (train, eval, predict, embed, augment, probe) opens a file with
:func:`open_table`, so all read it alike: ``data.encoding`` (UTF-8 by default) with a UTF-8 BOM
dropped and undecodable bytes named by offset and row; CSV with the csv module's quoting, TSV
without (as GLUE's: a stray ``"`` is text), JSONL split at ``\\n`` only (a U+2028 in a string is
text), JSON as a list of records, Parquet in record batches, TXT one sentence a line; blank lines
skipped; rows numbered as the file is (the line, or the record for JSON/Parquet). A header naming a
column twice, a key twice in a record, a non-object record, a short row, a directory or a FIFO is
refused in one line. :meth:`TableFile.chunks` streams the rows, so ``predict`` and ``embed`` hold
one chunk at a time; :func:`read_file` gathers them into one :class:`Table` of logical columns.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import itertools
import json
import math
import os
import stat
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from finetune_cli.errors import DataError, error_text

PKG_RESOURCES = Path(__file__).resolve().parent.parent / "resources"
Col = Union[str, int]
CHUNK_ROWS = 2048  # rows a streaming command holds at a time: 32 length-sorted batches of 64
FORMATS = ("csv", "tsv", "jsonl", "json", "parquet", "txt")
# The most characters one line (a row, a header) of a line-based file may hold: a longer one is
# refused before it is held whole, so memory stays bounded on any input (a file of one 1-GB line
# once took an embedding run to 20 GB). Far above any text an encoder reads (512 tokens).
MAX_ROW_CHARS = 1 << 20


@dataclass
class Table:
    columns: dict[str, list[Any]]
    source: str
    label_names: Optional[list[str]] = None  # from the source itself (hub ClassLabel)
    row_ids: list[int] = field(default_factory=list)  # 1-based row numbers in the source, for messages

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else len(self.row_ids)

    def select(self, idx: list[int]) -> Table:
        return Table({k: [v[i] for i in idx] for k, v in self.columns.items()}, self.source, self.label_names,
                     [self.row_ids[i] for i in idx] if self.row_ids else [])

    def row(self, i: int) -> int:
        return self.row_ids[i] if self.row_ids else i + 1


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
    for s in reversed([s.lower() for s in path.suffixes]):
        if s[1:] in FORMATS:
            return s[1:]
    raise DataError(f"cannot tell the format of {path} from its extension: name it .csv, .tsv, .jsonl, .json, .parquet "
                    f"or .txt (a recipe may set data.format instead)")


ENCODING_HINT = "set data.encoding (e.g. data.encoding=latin-1) or convert the file to UTF-8"
CONVERT_HINT = "convert it to UTF-8 (e.g. iconv -f latin1 -t utf-8 IN > OUT)"


def check_encoding(name: str) -> str:
    """The codec's canonical name, or a one-line error."""
    try:
        return codecs.lookup(name).name
    except LookupError:
        raise DataError(f"unknown text encoding `{name}` (try utf-8, latin-1, cp1252, utf-16)") from None


def check_input_file(path: Path, src: str) -> None:
    """A file to read: it exists and is a regular file (a FIFO cannot be read twice, a folder not at all)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise DataError(f"data file not found: {src}") from None
    except OSError as e:
        raise DataError(f"cannot read {src}: {e.strerror or e}") from None
    if stat.S_ISDIR(mode):
        raise DataError(f"data file {src} is a directory, not a file")
    if not stat.S_ISREG(mode):
        kind = "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        raise DataError(f"data file {src} is not a regular file but {kind}; write the rows to a file and pass that")
    magic = b""
    with contextlib.suppress(OSError), path.open("rb") as f:
        magic = f.read(4)
    for sig, kind, tool in ((b"\x1f\x8b", "gzip", "gunzip"), (b"PK\x03\x04", "zip", "unzip"),
                            (b"BZh", "bzip2", "bunzip2"), (b"\xfd7zX", "xz", "unxz")):
        if magic.startswith(sig) and path.suffix.lower() not in (".parquet",):
            raise DataError(f"data file {src} is {kind}-compressed; decompress it first ({tool} {src})")


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


def invalid_text(v: Any, column: str) -> Optional[str]:
    """Why ``v`` is not a usable text of ``column`` (null, missing, not a string, blank), or None.
    Every command refuses such a row the same way: a list or a number is never ``str()``-ed."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return f"has no text in column `{column}` (null or missing)"
    if not isinstance(v, str):
        return f"has {type(v).__name__} {repr(v)[:60]} in text column `{column}`, not a string"
    if not v.strip():
        return f"has an empty text in column `{column}`"
    return None


def check_texts(t: Table, columns: Sequence[str], names: Optional[Sequence[str]] = None) -> None:
    """Refuse the first row of ``t`` without a usable text in ``columns`` (shown as ``names``)."""
    for c, shown in zip(columns, names or columns, strict=True):
        for i, v in enumerate(t.columns[c]):
            why = invalid_text(v, shown)
            if why is not None:
                raise DataError(f"row {t.row(i)} of {t.source} {why}")


# ---- decoding and rows -------------------------------------------------------------------------

def _decode_error(path: Path, src: str, encoding: str, hint: str) -> DataError:
    """Where a file stops being ``encoding``: the byte offset and the row, found by decoding again
    block by block (the fast reader only knows that it failed)."""
    dec = codecs.getincrementaldecoder(check_encoding(encoding))()
    done, rows = 0, 1
    with path.open("rb") as f:
        for block in itertools.chain(iter(lambda: f.read(1 << 20), b""), [None]):
            pending = dec.getstate()[0]
            try:
                dec.decode(block or b"", final=block is None)
            except UnicodeDecodeError as e:
                data = pending + (block or b"")
                rows += (block or b"").count(b"\n", 0, max(0, e.start - len(pending)))
                return DataError(f"{src} is not valid {encoding}: byte(s) {data[e.start:e.end][:4].hex(' ')} at byte "
                                 f"offset {done - len(pending) + e.start} (row {rows}); {hint}")
            if block is not None:
                rows, done = rows + block.count(b"\n"), done + len(block)
    return DataError(f"{src} is not valid {encoding}; {hint}")  # pragma: no cover - the decoder disagreed


class _DuplicateKey(Exception):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        raise _DuplicateKey(next(k for k, _ in pairs if k in seen or seen.add(k)))  # type: ignore[func-returns-value]
    return d


def _json(text: str, src: str, line: Optional[int] = None) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as e:
        raise DataError(f"malformed JSON in {src}: {e.msg} at line {line or e.lineno}, column {e.colno}") from None
    except _DuplicateKey as e:
        raise DataError(f"key `{e}` appears twice in {f'row {line}' if line else 'a record'} of {src}") from None


def json_records(obj: Any, src: str) -> list[Any]:
    """A JSON file's records: a top-level list, or the list under an object's ``data`` key."""
    records = obj.get("data") if isinstance(obj, dict) and "data" in obj else obj
    if not isinstance(records, list):
        raise DataError(f"{src} must hold a JSON list of records (or an object whose `data` is one); its top "
                        f"level is {'an object' if isinstance(records, dict) else type(records).__name__}")
    return records


def _listed(names: Iterable[Any], n: int = 12, width: int = 40) -> str:
    """Column names for an error line: the first ``n``, each cut at ``width`` characters."""
    shown = [str(c) if len(str(c)) <= width else str(c)[: width - 1] + "…" for c in itertools.islice(names, n)]
    return ", ".join(shown)


def _batched(it: Iterator[Any], n: int) -> Iterator[list[Any]]:
    while part := list(itertools.islice(it, n)):
        yield part


@dataclass
class TableFile:
    """A local file opened by :func:`open_table`: its format and columns known, its rows read on
    demand (:meth:`chunks`), as often as needed."""

    path: Path
    src: str
    fmt: str
    encoding: str = "utf-8"
    hint: str = ENCODING_HINT
    names: list[str] = field(default_factory=list)  # columns in file order ("0", "1" … without a header)
    has_header: bool = False
    _records: Optional[list[Any]] = field(default=None, repr=False)  # a JSON document, parsed once

    # ---- rows: (row number, raw row) ------------------------------------------------------------
    def _lines(self, newline: Optional[str], bounded: bool = True) -> Iterator[str]:
        """The file's lines; ``bounded``: one longer than :data:`MAX_ROW_CHARS` is refused, read no
        further than that (a JSON document, one record over many lines or one, is read whole)."""
        codec = check_encoding(self.encoding)
        limit = MAX_ROW_CHARS if bounded else -1
        try:
            with open(self.path, encoding="utf-8-sig" if codec == "utf-8" else codec, newline=newline) as f:
                n = 0
                while line := f.readline(limit + 1 if bounded else -1):
                    n += 1
                    if bounded and len(line) > limit and len(line.rstrip("\r\n")) > limit:
                        raise DataError(f"line {n} of {self.src} holds more than {MAX_ROW_CHARS:,} characters, the "
                                        f"most one row may hold; shorten or split that text")
                    yield line
        except UnicodeDecodeError:
            raise _decode_error(self.path, self.src, self.encoding, self.hint) from None
        except OSError as e:
            raise DataError(f"cannot read {self.src}: {e.strerror or e}") from None

    def _delimited(self) -> Iterator[tuple[int, list[str]]]:
        if self.fmt == "tsv":
            for n, line in enumerate(self._lines(""), 1):
                if s := line.rstrip("\r\n"):
                    yield n, s.split("\t")
            return
        reader = csv.reader(self._lines(""))
        while True:
            start = reader.line_num + 1
            try:
                row = next(reader, None)
            except csv.Error as e:
                raise DataError(f"row {start} of {self.src} is not valid CSV: {e}") from None
            if row is None:
                return
            if row:
                yield start, row

    def _rows(self) -> Iterator[tuple[int, Any]]:
        if self.fmt in ("csv", "tsv"):
            return itertools.islice(self._delimited(), 1 if self.has_header else 0, None)
        if self.fmt == "txt":
            return ((n, s.rstrip("\n")) for n, s in enumerate(self._lines(None), 1) if s.strip())
        if self.fmt == "jsonl":
            return ((n, _json(s, self.src, n)) for n, s in enumerate(self._lines("\n"), 1) if s.strip())
        if self._records is None:
            self._records = json_records(_json("".join(self._lines("", bounded=False)), self.src), self.src)
        return enumerate(self._records, 1)

    def _object(self, n: int, rec: Any) -> Mapping[str, Any]:
        if not isinstance(rec, Mapping):
            raise DataError(f"row {n} of {self.src} is not a JSON object ({type(rec).__name__} {str(rec)[:40]})")
        return rec

    # ---- columns --------------------------------------------------------------------------------
    def key(self, col: Col) -> str:
        """The name chunks give column ``col`` (a name, or a 0-based index), or a one-line error."""
        delimited = self.fmt in ("csv", "tsv")
        if self.fmt == "txt" or col in self.names:
            return "text" if self.fmt == "txt" else str(col)
        if delimited and str(col).isdigit() and (not self.has_header or int(col) < len(self.names)):
            return self.names[int(col)] if self.has_header else str(int(col))
        where = (f"header: {_listed(self.names) if self.has_header else 'none'}" if delimited
                 else f"keys of row 1: {_listed(self.names)}")
        raise DataError(f"missing column `{col}` in {self.src} ({where})")

    def _picker(self, keys: list[str], optional: Collection[str], strict: bool) -> Callable[[int, Any], list[Any]]:
        src = self.src
        if self.fmt == "txt":
            return lambda n, line: [line] * len(keys)
        if self.fmt in ("csv", "tsv"):
            pos = [self.names.index(k) if self.has_header else int(k) for k in keys]
            need = len(self.names) if strict else max(pos, default=-1) + 1

            def pick_fields(n: int, row: list[str]) -> list[Any]:
                if len(row) < need or (strict and len(row) != need):
                    raise DataError(f"row {n} of {src} has {len(row)} fields, expected "
                                    f"{need if strict else f'at least {need}'}")
                return [row[i] for i in pos]
            return pick_fields

        def pick_keys(n: int, rec: Any) -> list[Any]:
            rec = self._object(n, rec)
            for k in keys:
                if k not in rec and k not in optional:
                    raise DataError(f"missing column `{k}` in row {n} of {src} (keys: {_listed(rec)})")
            return [rec.get(k) for k in keys]
        return pick_keys

    def chunks(self, size: int = CHUNK_ROWS, columns: Optional[Sequence[str]] = None,
               optional: Collection[str] = ()) -> Iterator[Table]:
        """The rows in chunks of at most ``size``, each a :class:`Table` of ``columns`` (names from
        :meth:`key`; a record without one of ``optional`` gives None) with its rows' numbers.
        ``columns`` None: every column, and every field of a row (for JSON records, every key of the
        chunk's records, None where a record lacks one)."""
        if self.fmt == "parquet":
            yield from self._parquet_chunks(size, columns)
            return
        if columns is None and self.fmt in ("jsonl", "json"):
            for part in _batched(self._rows(), size):
                recs = [self._object(n, r) for n, r in part]
                keys = list(dict.fromkeys(str(k) for r in recs for k in r))
                yield Table({k: [r.get(k) for r in recs] for k in keys}, self.src, row_ids=[n for n, _ in part])
            return
        keys = list(dict.fromkeys(columns if columns is not None else self.names))
        pick = self._picker(keys, optional, strict=columns is None)
        for part in _batched(self._rows(), size):
            vals = [pick(n, r) for n, r in part]
            yield Table({k: [v[i] for v in vals] for i, k in enumerate(keys)}, self.src,
                        row_ids=[n for n, _ in part])

    def _parquet(self):
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise DataError("reading parquet needs pyarrow (pip install 'finetune-cli[parquet]')") from None
        try:
            return pa, pq.ParquetFile(self.path)
        except (pa.ArrowException, OSError) as e:
            raise self._bad_parquet(e) from None

    def _bad_parquet(self, e: Exception) -> DataError:
        return DataError(f"{self.src} is not a readable Parquet file ({error_text(e, 160)})")

    def _parquet_chunks(self, size: int, columns: Optional[Sequence[str]]) -> Iterator[Table]:
        pa, pf = self._parquet()
        keys = list(dict.fromkeys(columns if columns is not None else self.names))
        done = 0
        try:
            for batch in pf.iter_batches(batch_size=size, columns=keys):
                cols = {k: batch.column(i).to_pylist() for i, k in enumerate(keys)}
                yield Table(cols, self.src, row_ids=list(range(done + 1, done + batch.num_rows + 1)))
                done += batch.num_rows
        except (pa.ArrowException, OSError) as e:
            raise self._bad_parquet(e) from None

    def read(self, keys: Mapping[str, str], optional: Collection[str] = ()) -> Table:
        """Every row, column ``keys[name]`` under ``name``: the whole file as one table."""
        cols: dict[str, list[Any]] = {name: [] for name in keys}
        ids: list[int] = []
        for chunk in self.chunks(columns=list(keys.values()), optional=optional):
            for name, k in keys.items():
                cols[name].extend(chunk.columns[k])
            ids.extend(chunk.row_ids)
        return Table(cols, self.src, row_ids=ids)

    def survey(self, columns: Optional[Sequence[str]], texts: Sequence[str], size: int = CHUNK_ROWS,
               each: Optional[Callable[[Table], None]] = None, shown: Optional[Sequence[str]] = None
               ) -> tuple[list[str], int]:
        """Read every row once, keeping none, before any work is done on them: the file parses,
        every row has a usable text in ``texts`` (:func:`invalid_text`; shown as ``shown``), and
        ``each`` sees every chunk. Returns the columns (for JSON records with ``columns`` None, every
        key any record has, in order of appearance) and the number of rows."""
        names: dict[str, None] = dict.fromkeys(columns if columns is not None else self.names)
        rows = 0
        for chunk in self.chunks(size, columns):
            names.update(dict.fromkeys(chunk.columns))
            check_texts(chunk, texts, shown)
            if each is not None:
                each(chunk)
            rows += len(chunk)
        return list(names), rows


def open_table(path_str: str, fmt: str = "auto", header: str = "auto", encoding: str = "utf-8",
               hint: str = ENCODING_HINT, expect: Sequence[Col] = ()) -> TableFile:
    """Open a local file for reading: check it is a regular file, tell its format (``fmt`` or the
    extension) and find its columns. ``header`` (CSV/TSV): ``yes``, ``no``, or ``auto`` — a header
    when its first row names every column of ``expect`` that is a name (an ``expect`` name missing
    from it is an error). An empty file is an error; a header without rows is not."""
    path = resolve_path(path_str)
    check_input_file(path, path_str)
    tf = TableFile(path, path_str, detect_format(path, fmt), encoding, hint)
    check_encoding(encoding)
    if tf.fmt not in FORMATS:
        raise DataError(f"unsupported data format `{tf.fmt}` for {path_str}")
    if tf.fmt == "parquet":
        pf = tf._parquet()[1]
        tf.names, tf.has_header, first = list(pf.schema_arrow.names), True, pf.metadata.num_rows or None
    else:
        n, first = next(tf._rows(), (0, None))
        if tf.fmt in ("jsonl", "json"):
            tf.names, tf.has_header = [str(k) for k in tf._object(n, first)] if n else [], True
        elif tf.fmt in ("csv", "tsv") and first is not None:
            named = [c for c in expect if isinstance(c, str) and c]
            tf.has_header = header == "yes" or (header == "auto" and bool(named) and all(c in first for c in named))
            if header == "auto" and not tf.has_header and not all(c.isdigit() for c in named):
                missing = next(c for c in named if c not in first)
                raise DataError(f"missing column `{missing}` in {path_str} (header: {_listed(first)})")
            tf.names = list(first) if tf.has_header else [str(i) for i in range(len(first))]
        else:
            tf.names = ["text"]
    if first is None:
        raise DataError(f"data file {path_str} is empty")
    if tf.has_header and len(set(tf.names)) != len(tf.names):
        dup = next(c for c in tf.names if tf.names.count(c) > 1)
        raise DataError(f"column `{dup}` appears twice in the header of {path_str}; rename one")
    return tf


def read_file(path_str: str, colmap: Mapping[str, Optional[Col]], fmt: str = "auto", header: str = "auto",
              encoding: str = "utf-8", hint: str = ENCODING_HINT) -> Table:
    """Read ``path`` and pick the columns named in ``colmap`` (logical name -> column name or index).

    Columns mapped to None are skipped. A missing file, a missing column, a short row or an empty
    file raise :class:`DataError` naming the file (and the row). A ``.txt`` file's lines go to the
    first logical name.
    """
    wanted = {k: v for k, v in colmap.items() if v is not None}
    tf = open_table(path_str, fmt, header, encoding, hint, expect=list(wanted.values()))
    if tf.fmt == "txt":
        return tf.read({next(iter(wanted), "text"): "text"})
    return tf.read({name: tf.key(col) for name, col in wanted.items()})


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
        msg = error_text(e, 200)
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
