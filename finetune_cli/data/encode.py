"""Tokenise once, pad per batch.

``encode_table`` tokenises every example once (no padding) and caches the token ids on disk
(``$FINETUNE_CACHE``, default ``~/.cache/finetune_cli``) keyed by the tokenizer, the max length
and the texts themselves, so a rerun or a resumed run skips it. ``collate`` pads a batch to its
own longest row (dynamic padding), which with length-grouped batches wastes few tokens.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from finetune_cli.data.sources import Table

CACHE_ENV = "FINETUNE_CACHE"


@dataclass
class EncodedData:
    """Token ids per *view*: one view for a cross-encoder (text [SEP] text_pair), one per text
    column for bi-encoders (``encoding="separate"``)."""

    views: list[dict[str, list[list[int]]]]
    labels: Optional[np.ndarray]
    lengths: np.ndarray  # longest view per example, for length grouping

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


def _tokenize(tokenizer, a: list[str], b: Optional[list[str]], max_length: int) -> dict[str, list[list[int]]]:
    enc = tokenizer(a, b, truncation=True, max_length=max_length, padding=False)
    return {k: list(enc[k]) for k in ("input_ids", "token_type_ids") if k in enc}


def encode_table(t: Table, tokenizer, max_length: int, text_columns: tuple[str, ...], joint: bool,
                 use_cache: bool = True) -> EncodedData:
    """Tokenise ``text_columns`` of ``t``: jointly as one pair sequence or each on its own."""
    texts = [[str(x) for x in t.columns[c]] for c in text_columns if c in t.columns]
    key = _cache_key(tokenizer, max_length, texts, joint)
    path = cache_dir() / f"{key}.pkl"
    views = None
    if use_cache and path.is_file():
        try:
            with path.open("rb") as f:
                views = pickle.load(f)
        except Exception:  # a corrupt cache entry is just recomputed
            views = None
    if views is None:
        if joint:
            views = [_tokenize(tokenizer, texts[0], texts[1] if len(texts) > 1 else None, max_length)]
        else:
            views = [_tokenize(tokenizer, col, None, max_length) for col in texts]
        if use_cache:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                with tmp.open("wb") as f:
                    pickle.dump(views, f, protocol=pickle.HIGHEST_PROTOCOL)
                os.replace(tmp, path)
            except OSError:
                pass  # a read-only cache is not an error
    lengths = np.max(np.stack([np.fromiter((len(x) for x in v["input_ids"]), dtype=np.int64, count=len(t))
                               for v in views]), axis=0)
    labels = None
    if "label" in t.columns:
        lab = t.columns["label"]
        # float: regression scores, or multi-hot rows (multi-label); int64: class ids
        labels = np.asarray(lab, dtype=np.float32 if lab and isinstance(lab[0], (float, list)) else np.int64)
    return EncodedData(views, labels, lengths)


def _pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.as_tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids, mask


def collate(data: EncodedData, indices: list[int], pad_id: int) -> dict[str, Any]:
    """A batch: ``features`` (one padded dict per view), ``labels`` and the example ``index``."""
    features = []
    for v in data.views:
        ids, mask = _pad([v["input_ids"][i] for i in indices], pad_id)
        f = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in v:
            f["token_type_ids"], _ = _pad([v["token_type_ids"][i] for i in indices], 0)
        features.append(f)
    batch: dict[str, Any] = {"features": features, "index": torch.as_tensor(indices, dtype=torch.long)}
    if data.labels is not None:
        batch["labels"] = torch.from_numpy(data.labels[indices])
    return batch


def to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, list):
        return [to_device(v, device) for v in batch]
    return batch
