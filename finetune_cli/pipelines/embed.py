"""``finetune embed``: sentences -> embeddings (``.npy`` + row ids, or Parquet)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from finetune_cli.data.encode import encode_table
from finetune_cli.data.sources import detect_format, read_file, resolve_path
from finetune_cli.engine.device import resolve_device
from finetune_cli.engine.inference import forward_all
from finetune_cli.errors import DataError
from finetune_cli.metrics.similarity import l2_normalize
from finetune_cli.models.loading import default_max_length, load_embedding_model


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

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def read_sentences(path: str, column: Optional[str] = None, fmt: str = "auto") -> tuple[list[str], list[int]]:
    """Sentences and their 1-based row ids: every non-empty line of a ``.txt`` file, or ``column``
    (default ``text``) of a csv/tsv/jsonl/parquet file."""
    kind = detect_format(resolve_path(path), fmt)
    col: Any = column if column is not None else "text"
    if isinstance(col, str) and col.isdigit():
        col = int(col)
    t = read_file(path, {"text": col}, kind)
    texts = ["" if x is None else str(x) for x in t.columns["text"]]
    if not texts:
        raise DataError(f"no sentences in {path}")
    return texts, list(t.row_ids) or list(range(1, len(texts) + 1))


def embed_texts(model, tokenizer, texts: list[str], *, batch_size: int = 64, max_length: int = 128,
                normalize: bool = False, device=None, progress=None) -> np.ndarray:
    """(n, d) float32 embeddings, computed in length-sorted batches, returned in input order."""
    from finetune_cli.data.sources import Table

    enc = encode_table(Table({"text": texts}, "<texts>"), tokenizer, max_length, ("text",), joint=False,
                       use_cache=False)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    e = forward_all(model, enc, batch_size, pad, device, want=("embeddings",), progress=progress)["embeddings"]
    return l2_normalize(e).astype(np.float32) if normalize else e


def run_embed(model_name: str, input_path: str, output: str, ui, *, column: Optional[str] = None,
              fmt: str = "auto", batch_size: int = 64, max_length: Optional[int] = None,
              normalize: Optional[bool] = None, device: str = "auto") -> EmbedResult:
    """``max_length``/``normalize`` None: what the folder says (a sentence-transformers folder's
    ``max_seq_length`` and ``Normalize`` module, else the trained length and no normalisation)."""
    import time

    out = Path(output)
    if out.suffix not in (".npy", ".parquet"):
        raise DataError(f"output {output} must end in .npy or .parquet")
    texts, ids = read_sentences(input_path, column, fmt)
    model, tokenizer, path, st = load_embedding_model(model_name)
    if max_length is None:
        max_length = st.max_seq_length if st is not None and st.max_seq_length else default_max_length(path, tokenizer)
    if normalize is None:
        normalize = bool(st is not None and st.normalize)
    dev = resolve_device(device)
    model.to(dev)
    t0 = time.perf_counter()
    with ui.progress(len(texts), "embed", transient=True) as prog:
        emb = embed_texts(model, tokenizer, texts, batch_size=batch_size, max_length=max_length,
                          normalize=normalize, device=dev, progress=prog)
    secs = time.perf_counter() - t0
    out.parent.mkdir(parents=True, exist_ok=True)
    ids_file = None
    if out.suffix == ".npy":
        np.save(out, emb)
        ids_file = str(out.with_suffix(".ids.npy"))
        np.save(ids_file, np.asarray(ids, dtype=np.int64))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        emb_col = pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), emb.shape[1])
        pq.write_table(pa.table({"row_id": ids, "text": texts, "embedding": emb_col}), out)
    ui.log(f"{len(texts)} sentences -> {out} ({emb.shape[1]} dims, {len(texts) / max(secs, 1e-9):.0f}/s)")
    return EmbedResult(path, input_path, str(out), ids_file, len(texts), int(emb.shape[1]), normalize, round(secs, 3))
