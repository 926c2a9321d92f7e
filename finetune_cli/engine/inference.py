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


def forward_all(model, data: EncodedData, batch_size: int, pad_id: int, device: Optional[torch.device] = None,
                view: int = 0, want: tuple[str, ...] = ("logits",), progress=None,
                autocast_dtype: Optional[torch.dtype] = None) -> dict[str, np.ndarray]:
    """Run ``model`` over every example of ``data`` (one view), longest first, and return the
    requested outputs (``logits``, ``embeddings``) as float32 arrays in the original order.

    Outputs stay on the device until the end (one transfer, no host sync per batch), under
    ``torch.inference_mode``; ``autocast_dtype`` (e.g. bf16 on a GPU) runs the encoder in it.
    """
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    batches = sorted_batches(data.lengths, batch_size)
    outs: dict[str, list[torch.Tensor]] = {k: [] for k in want}
    cast = (torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype is not None
            else contextlib.nullcontext())
    done = 0
    procs = _SHARD.get()
    if procs is not None:  # sharded evaluation: this process scores every world-th batch
        batches = batches[procs.rank::procs.world]
    try:
        with torch.inference_mode(), cast:
            for idx in batches:
                batch = to_device(collate(data, idx, pad_id), device)
                res = model(batch["features"][view])
                for k in want:
                    v = getattr(res, k)
                    if v is not None:
                        outs[k].append(v.float())
                done += len(idx)
                if progress is not None:
                    progress.update(done)
    finally:
        if was_training:
            model.train()
    order = np.concatenate([np.asarray(b, dtype=np.int64) for b in batches]) if batches else np.zeros(0, np.int64)
    result: dict[str, np.ndarray] = {}
    for k, vs in outs.items():
        if vs:
            result[k] = torch.cat(vs).cpu().numpy()  # rows in `order`
    if procs is not None:  # gather every process's rows, then place them
        parts = procs.all_gather((order, result))
        order = np.concatenate([idx for idx, _ in parts])
        result = {k: np.concatenate([vals[k] for _, vals in parts if k in vals])
                  for k in {k for _, vals in parts for k in vals}}
    placed: dict[str, np.ndarray] = {}
    for k, host in result.items():
        arr = np.empty((len(data), *host.shape[1:]), dtype=host.dtype)
        arr[order] = host
        placed[k] = arr
    return placed


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


def pad_id_of(tokenizer) -> int:
    """The id batches are padded with (0 for a tokenizer without a pad token)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
