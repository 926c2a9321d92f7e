"""Tokenise once, pad per batch.

``encode_table`` tokenises every example once (no padding) and caches the token ids on disk
(``$FINETUNE_CACHE``, default ``~/.cache/finetune_cli``) keyed by the tokenizer, the max length
and the texts themselves, so a rerun or a resumed run skips it. The cache is a plain ``.npz`` of
integer arrays read with ``allow_pickle=False``: a cache file someone else wrote can be wrong at
worst (then it is recomputed), never code. ``collate`` pads a batch to its
own longest row (dynamic padding), which with length-grouped batches wastes few tokens.

**Long rows.** Every row is tokenised whole, then a row longer than ``max_length`` is cut here,
once, for every command, and counted (``EncodedData.cut``, reported by :func:`length_note`). The
special tokens always stay; of the text tokens the rule (``model.truncation``) keeps:

* ``head``: the first ``B`` (``B`` = ``max_length`` less the special tokens), as tokenizers do;
* ``tail``: the last ``B``;
* ``head_tail``: the first ``B // 4`` and the last ``B - B // 4`` (Sun et al. 2019, "How to
  Fine-Tune BERT for Text Classification?", arXiv 1905.05583, keep the first 128 and the last 382
  of 510: a quarter and three quarters, generalised to any length).

A jointly encoded pair shares ``B`` as tokenizers' ``longest_first`` does: the longer text is cut
until both are equally long, then both (an odd token to the longer, to the second on a tie); each text's share is
then taken by the rule. With ``stride`` (``predict``/``eval --stride N``) a long single text is not
cut but read in overlapping windows of ``B`` text tokens, consecutive windows sharing ``N`` tokens
(tokenizers' ``stride``); ``EncodedData.window_rows`` maps each window to its row.
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
from finetune_cli.errors import DataError

T = TypeVar("T")

CACHE_ENV = "FINETUNE_CACHE"


@dataclass
class EncodedData:
    """Token ids per *view*: one view for a cross-encoder (text [SEP] text_pair), one per text
    column for bi-encoders (``encoding="separate"``)."""

    views: list[dict[str, list[list[int]]]]
    labels: Optional[np.ndarray]
    lengths: np.ndarray  # longest view per example, for length grouping
    # rows longer than max_length (cut, or read in windows), out of ``rows``; of the windows, their row
    cut: int = 0
    window_rows: Optional[np.ndarray] = None
    # (view, key) -> _Flat, built on first use by ``collate``
    _flat_cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def rows(self) -> int:
        """Rows encoded (``len`` counts windows when a long row was read in several)."""
        return len(self.lengths) if self.window_rows is None else int(self.window_rows.max(initial=-1)) + 1

    @property
    def row_labels(self) -> Optional[np.ndarray]:
        """One label per row (windows repeat their row's)."""
        if self.labels is None or self.window_rows is None:
            return self.labels
        first = np.unique(self.window_rows, return_index=True)[1]
        return self.labels[first]


def length_note(data: EncodedData, length: str, rule: str, stride: Optional[int] = None) -> Optional[str]:
    """The warning line for the rows longer than the length, e.g. ``12 of 300 rows longer than
    model.max_length=64 were cut (model.truncation=head)``; None when no row was."""
    if not data.cut:
        return None
    if data.window_rows is not None and stride is not None:
        return (f"{data.cut} of {data.rows} rows longer than {length} were read in {len(data)} overlapping "
                f"windows sharing {stride} tokens, their outputs averaged (--stride {stride})")
    return f"{data.cut} of {data.rows} rows longer than {length} were cut ({rule})"


TRUNCATIONS = ("head", "tail", "head_tail")


def shares(lengths: list[int], budget: int) -> list[int]:
    """Text tokens each text of a row keeps within ``budget`` (tokenizers' ``longest_first``: the
    longer text is cut until both are equally long, then both; an odd token goes to the longer, the second on a tie)."""
    if sum(lengths) <= budget:
        return list(lengths)
    if len(lengths) == 1:
        return [budget]
    a, b = lengths
    short = min(a, b)
    if 2 * short <= budget:
        return [a, budget - a] if a == short else [budget - b, b]
    half, rest = budget // 2, budget - budget // 2
    return [rest, half] if a > b else [half, rest]


def pick(positions: list[int], keep: int, rule: str) -> list[int]:
    """``keep`` of ``positions`` by the truncation rule (see the module docstring)."""
    if keep >= len(positions):
        return positions
    if keep <= 0:
        return []
    if rule == "head":
        return positions[:keep]
    if rule == "tail":
        return positions[len(positions) - keep:]
    head = keep // 4
    return positions[:head] + positions[len(positions) - (keep - head):]


def _segments(seq_ids: list[Optional[int]]) -> tuple[list[list[int]], list[int]]:
    """Positions of each text's tokens (in text order) and of the special tokens."""
    texts: dict[int, list[int]] = {}
    special = []
    for p, s in enumerate(seq_ids):
        if s is None:
            special.append(p)
        else:
            texts.setdefault(s, []).append(p)
    return [texts[k] for k in sorted(texts)], special


def _seq_ids(enc, i: int, special_mask: Optional[list[int]]) -> list[Optional[int]]:
    """Which text each token of row ``i`` belongs to (None: a special token): the fast tokenizer's
    ``sequence_ids``, else the runs of non-special tokens numbered in order."""
    if getattr(enc, "is_fast", False):
        return enc.sequence_ids(i)
    out: list[Optional[int]] = []
    seg, prev = -1, True
    for m in special_mask or []:
        if m:
            out.append(None)
        else:
            seg += prev
            out.append(seg)
        prev = bool(m)
    return out


def _windows(seq_ids: list[Optional[int]], max_length: int, stride: int) -> list[list[int]]:
    """Positions of each window of a long single text: its special tokens around ``B`` text tokens,
    consecutive windows sharing ``stride`` of them."""
    (text, *more), special = _segments(seq_ids)
    if more:
        raise ValueError("windows of a pair")
    budget = max_length - len(special)
    if not 0 <= stride < budget:
        raise DataError(f"--stride {stride} must be below the text tokens a window holds ({budget}: the length "
                        f"{max_length} less {len(special)} special tokens)")
    before = [p for p in special if p < text[0]]
    after = [p for p in special if p > text[0]]
    step, out, start = budget - stride, [], 0
    while True:
        out.append(before + text[start:start + budget] + after)
        if start + budget >= len(text):
            return out
        start += step


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "finetune_cli")) / "tokens"


def _cache_key(tokenizer, max_length: int, texts: list[list[str]], joint: bool, truncation: str = "head",
               stride: Optional[int] = None) -> str:
    h = hashlib.sha256()
    h.update(f"{getattr(tokenizer, 'name_or_path', '')}|{len(tokenizer)}|{type(tokenizer).__name__}|"
             f"{max_length}|{joint}|{tokenizer.padding_side}|{truncation}|{stride}".encode())
    for col in texts:
        for t in col:
            h.update(t.encode("utf-8", "replace"))
            h.update(b"\x00")
        h.update(b"\x01")
    return h.hexdigest()[:32]


def _tokenize(tokenizer, a: list[str], b: Optional[list[str]], max_length: int, truncation: str = "head",
              stride: Optional[int] = None, step: int = 512) -> tuple[dict[str, list[list[int]]], np.ndarray,
                                                                       Optional[np.ndarray]]:
    """Token ids (and type ids) of every row (or window), whether each row was longer than
    ``max_length``, and (``stride``) the row of each window. Rows are tokenised whole, ``step`` at a
    time (a fast tokenizer's per-token objects for a whole table would cost far more memory than
    the ids kept), then cut (or windowed) here: see the module docstring."""
    if truncation not in TRUNCATIONS:
        raise ValueError(f"truncation must be one of {TRUNCATIONS}, got {truncation!r}")
    out: dict[str, list[list[int]]] = {"input_ids": []}
    long = np.zeros(len(a), dtype=bool)
    rows: Optional[list[int]] = [] if stride is not None else None
    for i in range(0, len(a), step):
        enc = tokenizer(a[i:i + step], b[i:i + step] if b is not None else None, truncation=False, padding=False,
                        return_attention_mask=False, return_special_tokens_mask=not getattr(tokenizer, "is_fast", True),
                        verbose=False)
        keys = [k for k in ("input_ids", "token_type_ids") if k in enc]
        for j, ids in enumerate(enc["input_ids"]):
            if len(ids) <= max_length:
                for k in keys:
                    out.setdefault(k, []).append(enc[k][j])
                if rows is not None:
                    rows.append(i + j)
                continue
            long[i + j] = True
            seq = _seq_ids(enc, j, enc.get("special_tokens_mask", [None] * (j + 1))[j])
            if stride is not None:
                parts = _windows(seq, max_length, stride)
            else:
                texts, special = _segments(seq)
                budget = max(max_length - len(special), 0)
                kept = [p for t, n in zip(texts, shares([len(t) for t in texts], budget), strict=True)
                        for p in pick(t, n, truncation)]
                parts = [sorted(special + kept)]
            for pos in parts:
                for k in keys:
                    row = enc[k][j]
                    out.setdefault(k, []).append([row[p] for p in pos])
                if rows is not None:
                    rows.append(i + j)
    return out, long, (np.asarray(rows, dtype=np.int64) if rows is not None else None)


def _save_views(path: Path, views: list[dict[str, list[list[int]]]], long: np.ndarray,
                rows: Optional[np.ndarray]) -> None:
    """Each ragged ``list[list[int]]`` as a flat int32 array plus offsets, with which rows were long
    and (windows) each window's row, in one ``.npz``."""
    arrays: dict[str, np.ndarray] = {"long": long.astype(np.int8)}
    if rows is not None:
        arrays["window_rows"] = rows.astype(np.int64)
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


def _load_views(path: Path, n_rows: int) -> Optional[tuple[list[dict[str, list[list[int]]]], np.ndarray,
                                                            Optional[np.ndarray]]]:
    """The cached views, long-row flags and window rows, or None when the file is missing, damaged
    or does not fit ``n_rows`` rows."""
    try:
        with np.load(path, allow_pickle=False) as z:
            views: dict[int, dict[str, list[list[int]]]] = {}
            long = z["long"].astype(bool)
            rows = z["window_rows"] if "window_rows" in z.files else None
            if long.shape != (n_rows,):
                return None
            if rows is not None and (rows.dtype.kind not in "iu" or (len(rows) and rows.max() >= len(long))):
                return None
            n = len(rows) if rows is not None else len(long)
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
    return [views[i] for i in range(len(views))], long, rows


def encode_table(t: Table, tokenizer, max_length: int, text_columns: tuple[str, ...], joint: bool,
                 use_cache: bool = True, truncation: str = "head", stride: Optional[int] = None) -> EncodedData:
    """Tokenise ``text_columns`` of ``t``: jointly as one pair sequence or each on its own; rows
    longer than ``max_length`` cut by ``truncation``, or (``stride``, a single text) read in
    overlapping windows. ``EncodedData.cut`` counts the long rows."""
    texts = [[str(x) for x in t.columns[c]] for c in text_columns if c in t.columns]
    if stride is not None and (len(texts) > 1):
        raise DataError("--stride reads one text in overlapping windows; a sentence pair is cut by its "
                        "model.truncation rule instead (the longer text first)")
    key = _cache_key(tokenizer, max_length, texts, joint, truncation, stride)
    path = cache_dir() / f"{key}.npz"
    cached = _load_views(path, len(t)) if use_cache and path.is_file() else None
    if cached is not None:
        views, long, rows = cached
    else:
        if joint:
            parts = [_tokenize(tokenizer, texts[0], texts[1] if len(texts) > 1 else None, max_length, truncation,
                               stride)]
        else:
            parts = [_tokenize(tokenizer, col, None, max_length, truncation, stride) for col in texts]
        views = [v for v, _, _ in parts]
        long = np.any(np.stack([c for _, c, _ in parts]), axis=0) if parts else np.zeros(len(t), bool)
        rows = parts[0][2] if parts else None
        if use_cache:
            try:
                _save_views(path, views, long, rows)
            except OSError:
                pass  # a read-only or full cache is not an error
    n = len(views[0]["input_ids"]) if views else len(t)
    lengths = np.max(np.stack([np.fromiter((len(x) for x in v["input_ids"]), dtype=np.int64, count=n)
                               for v in views]), axis=0)
    labels = None
    if "label" in t.columns:
        lab = t.columns["label"]
        # float: regression scores, or multi-hot rows (multi-label); int64: class ids
        labels = np.asarray(lab, dtype=np.float32 if lab and isinstance(lab[0], (float, list)) else np.int64)
        if rows is not None:
            labels = labels[rows]
    return EncodedData(views, labels, lengths, cut=int(np.count_nonzero(long)), window_rows=rows)


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


def shape_key(batch: Any) -> tuple:
    """The shapes and dtypes of every tensor of a batch: one graph per key."""
    if isinstance(batch, torch.Tensor):
        return (tuple(batch.shape), batch.dtype)
    if isinstance(batch, dict):
        return tuple((k, shape_key(v)) for k, v in sorted(batch.items()))
    if isinstance(batch, (list, tuple)):
        return tuple(shape_key(v) for v in batch)
    return (batch,)


def copy_into(static: Any, batch: Any) -> None:
    """Copy ``batch`` (host, page-locked on CUDA) into the graph's input buffers, asynchronously."""
    if isinstance(static, torch.Tensor):
        static.copy_(batch, non_blocking=True)
    elif isinstance(static, dict):
        for k, v in static.items():
            copy_into(v, batch[k])
    elif isinstance(static, list):
        for s, b in zip(static, batch, strict=True):
            copy_into(s, b)
