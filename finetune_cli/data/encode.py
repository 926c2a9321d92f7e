"""Tokenise once, pad per batch.

``encode_table`` tokenises every example once (no padding) and caches the token ids on disk
(``$FINETUNE_CACHE``, default ``~/.cache/finetune_cli``) keyed by the tokenizer, the max length
and the texts themselves, so a rerun or a resumed run skips it. The cache is a plain ``.npz`` of
integer arrays read with ``allow_pickle=False``: a cache file someone else wrote can be wrong at
worst (then it is recomputed), never code. ``collate`` pads a batch to its
own longest row (dynamic padding), which with length-grouped batches wastes few tokens.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import zipfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, TypeVar

import numpy as np
import torch

from finetune_cli.data.sources import Table

T = TypeVar("T")

CACHE_ENV = "FINETUNE_CACHE"


@dataclass
class EncodedData:
    """Token ids per *view*: one view for a cross-encoder (text [SEP] text_pair), one per text
    column for bi-encoders (``encoding="separate"``)."""

    views: list[dict[str, list[list[int]]]]
    labels: Optional[np.ndarray]
    lengths: np.ndarray  # longest view per example, for length grouping
    # (view, key) -> _Flat, built on first use by ``collate``
    _flat_cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.lengths)


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "finetune_cli")) / "tokens"


def _cache_key(tokenizer, max_length: int, texts: list[list[str]], joint: bool) -> str:
    h = hashlib.sha256()
    h.update(f"{getattr(tokenizer, 'name_or_path', '')}|{len(tokenizer)}|{type(tokenizer).__name__}|"
             f"{max_length}|{joint}|{tokenizer.padding_side}".encode())
    for col in texts:
        for t in col:
            h.update(t.encode("utf-8", "replace"))
            h.update(b"\x00")
        h.update(b"\x01")
    return h.hexdigest()[:32]


def _tokenize(tokenizer, a: list[str], b: Optional[list[str]], max_length: int,
              step: int = 512) -> dict[str, list[list[int]]]:
    """Token ids (and type ids) of every row, tokenised ``step`` rows at a time: a fast tokenizer's
    per-token objects for a whole table would cost far more memory than the ids kept."""
    out: dict[str, list[list[int]]] = {"input_ids": []}
    for i in range(0, len(a), step):
        enc = tokenizer(a[i:i + step], b[i:i + step] if b is not None else None, truncation=True,
                        max_length=max_length, padding=False, return_attention_mask=False)
        for k in ("input_ids", "token_type_ids"):
            if k in enc:
                out.setdefault(k, []).extend(enc[k])
    return out


def _save_views(path: Path, views: list[dict[str, list[list[int]]]]) -> None:
    """Each ragged ``list[list[int]]`` as a flat int32 array plus offsets, in one ``.npz``."""
    arrays: dict[str, np.ndarray] = {}
    for i, v in enumerate(views):
        for k, rows in v.items():
            lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
            arrays[f"v{i}.{k}.offsets"] = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            arrays[f"v{i}.{k}.flat"] = np.fromiter((t for r in rows for t in r), dtype=np.int32,
                                                   count=int(lengths.sum()))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")
    try:
        np.savez(tmp, **arrays)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _load_views(path: Path, n: int) -> Optional[list[dict[str, list[list[int]]]]]:
    """The cached views, or None when the file is missing, damaged or does not fit ``n`` rows."""
    try:
        with np.load(path, allow_pickle=False) as z:
            views: dict[int, dict[str, list[list[int]]]] = {}
            for name in z.files:
                if not name.endswith(".flat"):
                    continue
                vi, key, _ = name.split(".")
                flat, off = z[name], z[f"{vi}.{key}.offsets"]
                if flat.dtype.kind not in "iu" or off.shape != (n + 1,) or off[-1] != len(flat):
                    return None
                flat_l = flat.tolist()
                views.setdefault(int(vi[1:]), {})[key] = [flat_l[a:b] for a, b in zip(off[:-1], off[1:], strict=True)]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return None
    if not views or sorted(views) != list(range(len(views))):
        return None
    return [views[i] for i in range(len(views))]


def encode_table(t: Table, tokenizer, max_length: int, text_columns: tuple[str, ...], joint: bool,
                 use_cache: bool = True) -> EncodedData:
    """Tokenise ``text_columns`` of ``t``: jointly as one pair sequence or each on its own."""
    texts = [[str(x) for x in t.columns[c]] for c in text_columns if c in t.columns]
    key = _cache_key(tokenizer, max_length, texts, joint)
    path = cache_dir() / f"{key}.npz"
    views = _load_views(path, len(t)) if use_cache and path.is_file() else None
    if views is None:
        if joint:
            views = [_tokenize(tokenizer, texts[0], texts[1] if len(texts) > 1 else None, max_length)]
        else:
            views = [_tokenize(tokenizer, col, None, max_length) for col in texts]
        if use_cache:
            try:
                _save_views(path, views)
            except OSError:
                pass  # a read-only or full cache is not an error
    lengths = np.max(np.stack([np.fromiter((len(x) for x in v["input_ids"]), dtype=np.int64, count=len(t))
                               for v in views]), axis=0)
    labels = None
    if "label" in t.columns:
        lab = t.columns["label"]
        # float: regression scores, or multi-hot rows (multi-label); int64: class ids
        labels = np.asarray(lab, dtype=np.float32 if lab and isinstance(lab[0], (float, list)) else np.int64)
    return EncodedData(views, labels, lengths)


class _Flat:
    """One view's ragged rows as one flat int64 array plus offsets, so a batch is gathered and
    padded with a few numpy ops instead of one small tensor op per row."""

    def __init__(self, rows: list[list[int]]):
        lens = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        self.offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lens, out=self.offsets[1:])
        self.lens = lens
        self.flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(self.offsets[-1]))

    def pad(self, idx: np.ndarray, width: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
        lens = self.lens[idx]
        cols = np.arange(width, dtype=np.int64)
        valid = cols[None, :] < lens[:, None]
        # positions past a row's end point at its first token (always valid memory) and are masked
        pos = self.offsets[idx][:, None] + np.where(valid, cols[None, :], 0)
        ids = np.where(valid, self.flat[pos] if len(self.flat) else 0, pad_id)
        return ids, valid.astype(np.int64)


def _flat(data: EncodedData, view: int, key: str) -> _Flat:
    cache = data._flat_cache
    if (view, key) not in cache:
        cache[(view, key)] = _Flat(data.views[view][key])
    return cache[(view, key)]


def padded_width(longest: int, multiple: int = 1, cap: Optional[int] = None) -> int:
    """``longest`` rounded up to a multiple of ``multiple`` (never past ``cap`` when given, nor
    below ``longest``): with ``train.compile`` a handful of widths means a handful of graphs."""
    w = -(-longest // multiple) * multiple
    return max(longest, min(w, cap)) if cap is not None else w


def collate(data: EncodedData, indices: list[int], pad_id: int, pad_to_multiple: int = 1,
            max_width: Optional[int] = None) -> dict[str, Any]:
    """A batch: ``features`` (one padded dict per view), ``labels`` and the example ``index``.

    Each view is padded to its longest row, rounded up to ``pad_to_multiple`` (capped at
    ``max_width``). The tensors are built with whole-batch numpy ops (see ``_Flat``).
    """
    idx = np.asarray(indices, dtype=np.int64)
    features = []
    for vi, v in enumerate(data.views):
        fl = _flat(data, vi, "input_ids")
        width = padded_width(int(fl.lens[idx].max()) if len(idx) else 0, pad_to_multiple, max_width)
        ids, mask = fl.pad(idx, width, pad_id)
        f = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
        if "token_type_ids" in v:
            f["token_type_ids"] = torch.from_numpy(_flat(data, vi, "token_type_ids").pad(idx, width, 0)[0])
        features.append(f)
    batch: dict[str, Any] = {"features": features, "index": torch.from_numpy(idx)}
    if data.labels is not None:
        batch["labels"] = torch.from_numpy(data.labels[idx])
    return batch


def pin(batch: Any) -> Any:
    """Page-locked copies of a batch's tensors, so host-to-GPU copies can run asynchronously."""
    if isinstance(batch, torch.Tensor):
        return batch.pin_memory()
    if isinstance(batch, dict):
        return {k: pin(v) for k, v in batch.items()}
    if isinstance(batch, list):
        return [pin(v) for v in batch]
    return batch


def to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, list):
        return [to_device(v, device) for v in batch]
    return batch


def prefetched(build: Callable[[T], Any], items: Sequence[T], pool: Optional[Executor]) -> Iterator[Any]:
    """``build(item)`` for each item in order, each built one ahead on ``pool`` (a one-worker
    executor) while the caller uses the current one; without a pool, built as asked for. ``build``
    must draw no random numbers (``collate`` draws none), so the results and the RNG stream are
    those of a loop without prefetch."""
    if pool is None:
        yield from (build(it) for it in items)
        return
    nxt = pool.submit(build, items[0]) if items else None
    for k in range(len(items)):
        assert nxt is not None
        b = nxt.result()
        nxt = pool.submit(build, items[k + 1]) if k + 1 < len(items) else None
        yield b
