"""Batched, length-sorted forward passes for evaluation and embedding.

Inside :func:`sharded` (the trainer's evaluation on several processes) every rank runs a share of
the batches and the outputs are gathered, so each rank returns the whole result. The batches are
those of one process (the same length-sorted cut, dealt round-robin), so every example is computed
in the same batch, with the same padding, as in a one-process run: the outputs, and the metrics
computed from them, are bit-identical to one process's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any, Optional

import numpy as np
import torch

from finetune_cli.data.encode import EncodedData, collate, to_device
from finetune_cli.data.sampling import sorted_batches

_SHARD: ContextVar[Optional[Any]] = ContextVar("finetune_inference_shard", default=None)


@contextlib.contextmanager
def sharded(procs) -> Iterator[None]:
    """Within this block :func:`forward_all` splits its batches over ``procs`` (a
    ``distributed.Processes``); every rank must make the same ``forward_all`` calls."""
    token = _SHARD.set(procs if procs is not None and procs.distributed else None)
    try:
        yield
    finally:
        _SHARD.reset(token)


@torch.no_grad()
def forward_all(model, data: EncodedData, batch_size: int, pad_id: int, device: Optional[torch.device] = None,
                view: int = 0, want: tuple[str, ...] = ("logits",), progress=None) -> dict[str, np.ndarray]:
    """Run ``model`` over every example of ``data`` (one view), longest first, and return the
    requested outputs (``logits``, ``embeddings``) as float32 arrays in the original order."""
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    n = len(data)
    out: dict[str, Optional[np.ndarray]] = {k: None for k in want}
    done = 0
    procs = _SHARD.get()
    batches = sorted_batches(data.lengths, batch_size)
    if procs is not None:
        batches = batches[procs.rank::procs.world]
    for idx in batches:
        batch = to_device(collate(data, idx, pad_id), device)
        res = model(batch["features"][view])
        for k in want:
            v = getattr(res, k).float().cpu().numpy()
            if out[k] is None:
                out[k] = np.zeros((n, *v.shape[1:]), dtype=np.float32)
            out[k][idx] = v
        done += len(idx)
        if progress is not None:
            progress.update(done)
    if was_training:
        model.train()
    if procs is not None:
        mine = np.asarray([i for b in batches for i in b], dtype=np.int64)
        parts = procs.all_gather((mine, {k: v[mine] for k, v in out.items() if v is not None}))
        out = {}
        for idx, vals in parts:
            for k, v in vals.items():
                if out.get(k) is None:
                    out[k] = np.zeros((n, *v.shape[1:]), dtype=np.float32)
                out[k][idx] = v
    return {k: v for k, v in out.items() if v is not None}


def file_features(model, tokenizer, path, pair: bool, max_length: int, batch_size: int) -> tuple[np.ndarray, list[str]]:
    """Pooled features and string labels of a ``text``/[``text_pair``]/``label`` JSONL file (a
    materialised probe task), the pair encoded jointly."""
    from finetune_cli.data.encode import encode_table
    from finetune_cli.data.sources import read_file

    cm = {"text": "text", "label": "label", **({"text_pair": "text_pair"} if pair else {})}
    t = read_file(str(path), cm, "jsonl")
    labels = [str(v) for v in t.columns.pop("label")]
    cols = ("text", "text_pair") if pair else ("text",)
    enc = encode_table(t, tokenizer, max_length, cols, joint=True)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return forward_all(model, enc, batch_size, pad, want=("embeddings",))["embeddings"], labels
