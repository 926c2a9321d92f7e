"""Batched, length-sorted forward passes for evaluation and embedding."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from finetune_cli.data.encode import EncodedData, collate, to_device
from finetune_cli.data.sampling import sorted_batches


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
    for idx in sorted_batches(data.lengths, batch_size):
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
