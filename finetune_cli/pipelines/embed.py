"""``finetune embed``: sentences -> embeddings (``.npy`` + row ids, or Parquet)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from finetune_cli.data.sources import CONVERT_HINT, detect_format, read_file, resolve_path
from finetune_cli.data.tasks import invalid_row
from finetune_cli.engine.inference import InferenceSession, open_session
from finetune_cli.errors import DataError
from finetune_cli.fsutil import atomic_file, check_output_file
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


def read_sentences(path: str, column: Optional[str] = None, fmt: str = "auto") -> tuple[list[str], list[int]]:
    """Sentences and their 1-based row ids: every non-empty line of a ``.txt`` file, or ``column``
    (default ``text``) of a csv/tsv/jsonl/parquet file."""
    kind = detect_format(resolve_path(path), fmt)
    col: Any = column if column is not None else "text"
    if isinstance(col, str) and col.isdigit():
        col = int(col)
    t = read_file(path, {"text": col}, kind, hint=CONVERT_HINT)
    for i in range(len(t)):
        why = invalid_row(t, i, ("text",), label=False)
        if why is not None:
            row = t.row_ids[i] if t.row_ids else i + 1
            raise DataError(f"row {row} of {path} {why}".replace("`text`", f"`{column or 'text'}`"))
    texts = list(t.columns["text"])
    if not texts:
        raise DataError(f"no sentences in {path}")
    return texts, list(t.row_ids) or list(range(1, len(texts) + 1))


def embed_texts(sess: InferenceSession, texts: list[str], *, batch_size: int = 64, normalize: bool = False,
                progress=None) -> np.ndarray:
    """(n, d) float32 embeddings, computed in length-sorted batches at the session's length, device
    and precision, returned in input order."""
    e = sess.forward(sess.encode_texts(texts), batch_size, want=("embeddings",), progress=progress)["embeddings"]
    return l2_normalize(e).astype(np.float32) if normalize else e


def run_embed(model_name: str, input_path: str, output: str, ui, *, column: Optional[str] = None,
              fmt: str = "auto", batch_size: int = 64, max_length: Optional[int] = None,
              normalize: Optional[bool] = None, device: str = "auto", precision: str = "auto") -> EmbedResult:
    """``max_length``/``normalize`` None: what the folder says (a sentence-transformers folder's
    ``max_seq_length`` and ``Normalize`` module, else the trained length and no normalisation)."""
    import time

    out = Path(output)
    if out.suffix not in (".npy", ".parquet"):
        raise DataError(f"output {output} must end in .npy or .parquet")
    check_output_file(out, "--output")
    texts, ids = read_sentences(input_path, column, fmt)
    sess = open_session(model_name, device=device, precision=precision, max_length=max_length, embedding=True)
    if normalize is None:
        normalize = bool(sess.st is not None and sess.st.normalize)
    t0 = time.perf_counter()
    with ui.progress(len(texts), "embed", transient=True) as prog:
        emb = embed_texts(sess, texts, batch_size=batch_size, normalize=normalize, progress=prog)
    secs = time.perf_counter() - t0
    ids_file = None
    # Each file is written to a temp name and renamed: a failed write (full disk) leaves none.
    if out.suffix == ".npy":
        ids_file = str(out.with_suffix(".ids.npy"))
        with atomic_file(ids_file) as tmp:
            np.save(tmp, np.asarray(ids, dtype=np.int64))
        with atomic_file(out) as tmp:
            np.save(tmp, emb)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        emb_col = pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), emb.shape[1])
        with atomic_file(out) as tmp:
            pq.write_table(pa.table({"row_id": ids, "text": texts, "embedding": emb_col}), tmp)
    ui.log(f"{len(texts)} sentences -> {out} ({emb.shape[1]} dims, {len(texts) / max(secs, 1e-9):.0f}/s)")
    return EmbedResult(sess.path, input_path, str(out), ids_file, len(texts), int(emb.shape[1]), normalize,
                       round(secs, 3), sess.precision)
