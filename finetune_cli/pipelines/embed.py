"""``finetune embed``: sentences -> embeddings (``.npy`` + row ids, or Parquet).

As ``predict``: the input is read once to check it whole before the model loads, then chunk by
chunk through the model; the ``.npy`` files are written by appending each chunk's rows after a
header that already holds the row count, so memory holds one chunk. Every file is written to a
temporary name and renamed at the end: an interrupted or failed run leaves none.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from finetune_cli.data.sources import CHUNK_ROWS, CONVERT_HINT, TableFile, open_table, resolve_path
from finetune_cli.engine.inference import InferenceSession, open_session
from finetune_cli.errors import DataError
from finetune_cli.fsutil import atomic_file, check_apart, check_output_file
from finetune_cli.inputs import model_inputs
from finetune_cli.metrics.similarity import l2_normalize


@dataclass
class EmbedResult:
    model: str
    input: str
    output: str
    ids_file: Optional[str]
    sentences: int
    dim: int
    normalized: bool
    seconds: float
    precision: str  # what the model ran in: fp32, bf16 or fp16

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def open_sentences(path: str, column: Optional[str] = None, fmt: str = "auto",
                   chunk_rows: int = CHUNK_ROWS) -> tuple[TableFile, str, int]:
    """The input, its sentence column and its row count, checked whole (every row has a text):
    every non-empty line of a ``.txt`` file, or ``column`` (default ``text``; a 0-based index in a
    file without header) of a csv/tsv/jsonl/json/parquet file."""
    col: Any = column if column is not None else "text"
    if isinstance(col, str) and col.isdigit():
        col = int(col)
    tf = open_table(path, fmt, hint=CONVERT_HINT, expect=[col])
    key = tf.key(col)
    _, rows = tf.survey([key], [key], chunk_rows, shown=[column or "text"])
    if rows == 0:
        raise DataError(f"no sentences in {path}")
    return tf, key, rows


def embed_texts(sess: InferenceSession, texts: list[str], *, batch_size: int = 64, normalize: bool = False,
                progress=None) -> np.ndarray:
    """(n, d) float32 embeddings, computed in length-sorted batches at the session's length, device
    and precision, returned in input order."""
    e = sess.forward(sess.encode_texts(texts), batch_size, want=("embeddings",), progress=progress)["embeddings"]
    return l2_normalize(e).astype(np.float32) if normalize else e


def _npy_header(f, shape: tuple[int, ...], dtype: Any) -> None:
    """The header ``np.save`` writes, for rows appended after it."""
    np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                             "fortran_order": False, "shape": shape})


@contextlib.contextmanager
def _sink(out: Path, ids_file: Optional[Path], rows: int
          ) -> Iterator[Callable[[np.ndarray, list[str], np.ndarray], None]]:
    """``write(row_ids, texts, embeddings)`` per chunk, into temporary files renamed at the end."""
    if ids_file is not None:
        with atomic_file(ids_file) as tids, atomic_file(out) as temb, tids.open("wb") as fi, temb.open("wb") as fe:
            def write_npy(ids: np.ndarray, texts: list[str], emb: np.ndarray) -> None:
                if fe.tell() == 0:
                    _npy_header(fe, (rows, emb.shape[1]), np.float32)
                    _npy_header(fi, (rows,), np.int64)
                fe.write(np.ascontiguousarray(emb, dtype="<f4").tobytes())
                fi.write(np.asarray(ids, dtype="<i8").tobytes())
            yield write_npy
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    with atomic_file(out) as tmp, contextlib.ExitStack() as stack:
        writer: list[Any] = []

        def write_parquet(ids: np.ndarray, texts: list[str], emb: np.ndarray) -> None:
            cols = [pa.array(ids, pa.int64()), pa.array(texts, pa.string()),
                    pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), emb.shape[1])]
            if not writer:  # the first chunk gives the width
                schema = pa.schema([("row_id", pa.int64()), ("text", pa.string()), ("embedding", cols[2].type)])
                writer.append(stack.enter_context(pq.ParquetWriter(tmp, schema)))
            writer[0].write_table(pa.Table.from_arrays(cols, schema=writer[0].schema))
        yield write_parquet


def run_embed(model_name: str, input_path: str, output: str, ui, *, column: Optional[str] = None,
              fmt: str = "auto", batch_size: int = 64, max_length: Optional[int] = None,
              normalize: Optional[bool] = None, device: str = "auto", precision: str = "auto", cuda_graphs: str = "off",
              chunk_rows: int = CHUNK_ROWS) -> EmbedResult:
    """``max_length``/``normalize`` None: what the folder says (a sentence-transformers folder's
    ``max_seq_length`` and ``Normalize`` module, else the trained length and no normalisation)."""
    out = Path(output)
    if out.suffix not in (".npy", ".parquet"):
        raise DataError(f"output {output} must end in .npy or .parquet")
    check_output_file(out, "--output")
    for written in (out, out.with_suffix(".ids.npy")):
        check_apart(written, [("input file", resolve_path(input_path)), *model_inputs(model_name, whole_run=False)],
                    "--output")
    tf, key, rows = open_sentences(input_path, column, fmt, chunk_rows)
    sess = open_session(model_name, device=device, precision=precision, max_length=max_length, embedding=True,
                        cuda_graphs=cuda_graphs)
    if normalize is None:
        normalize = bool(sess.st is not None and sess.st.normalize)
    ids_file = out.with_suffix(".ids.npy") if out.suffix == ".npy" else None
    t0, done, dim = time.perf_counter(), 0, 0
    with ui.progress(rows, "embed", transient=True) as prog, _sink(out, ids_file, rows) as write:
        for chunk, outs in sess.stream(tf.chunks(chunk_rows, [key]), [key], batch_size, joint=False,
                                       want=("embeddings",), progress=prog):
            emb = outs["embeddings"]
            emb = l2_normalize(emb).astype(np.float32) if normalize else emb
            # The row id: the record's 1-based number among the file's data rows (header and blank
            # lines not counted), the same for every format; every record is embedded, in order.
            write(np.arange(done + 1, done + len(chunk) + 1), chunk.columns[key], emb)
            done, dim = done + len(chunk), int(emb.shape[1])
        if done != rows:  # the header promised `rows` rows
            raise DataError(f"{input_path} changed while it was read ({rows} rows, then {done}); rerun")
    secs = time.perf_counter() - t0
    if (note := sess.length_note()) is not None:
        ui.warn(f"{input_path}: {note}")
    ui.log(f"{rows} sentences -> {out} ({dim} dims, {rows / max(secs, 1e-9):.0f}/s)")
    return EmbedResult(sess.path, input_path, str(out), str(ids_file) if ids_file else None, rows, dim, normalize,
                       round(secs, 3), sess.precision)
