"""Activation memory and time of one training step with and without ``train.gradient_checkpointing``.

The memory is what autograd keeps for the backward pass: the bytes of every tensor saved during the
forward pass (``torch.autograd.graph.saved_tensors_hooks``; the checkpointed layers save only their
inputs), which is the activation part of a step's peak on any device. On a CUDA device the step's
``torch.cuda.max_memory_allocated`` is printed too. Gradients are compared, as a check.

    python bench/checkpointing_memory.py [--model embedded|tiny] [--batch 32] [--length 128] [--device cpu]
"""

from __future__ import annotations

import argparse
import copy
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from finetune_cli.models.loading import build_text_model  # noqa: E402
from finetune_cli.models.text_model import HeadSpec, enable_gradient_checkpointing  # noqa: E402


def step(model, batch, checkpointing: bool, device: str):
    model = copy.deepcopy(model).to(device).train()
    if checkpointing:
        enable_gradient_checkpointing(model)
    saved = {"bytes": 0}

    def pack(t):
        saved["bytes"] += t.numel() * t.element_size()
        return t

    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model({k: v.to(device) for k, v in batch.items()})
    out.logits.logsumexp(-1).sum().backward()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() if device.startswith("cuda") else None
    grads = {n: p.grad.detach().cpu() for n, p in model.named_parameters() if p.grad is not None}
    return saved["bytes"], peak, secs, grads


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    torch.manual_seed(0)
    model, tok = build_text_model(a.model, lambda d: HeadSpec(num_labels=2))
    batch = dict(tok(["word " * a.length] * a.batch, truncation=True, max_length=a.length, return_tensors="pt"))
    plain = step(model, batch, False, a.device)
    ckpt = step(model, batch, True, a.device)
    diff = max((plain[3][k] - ckpt[3][k]).abs().max().item() for k in plain[3])
    print(f"model {a.model}, batch {a.batch} x {a.length} tokens, {a.device}")
    print(f"saved activations: plain {plain[0] / 2**20:.1f} MiB, checkpointing {ckpt[0] / 2**20:.1f} MiB "
          f"(ratio {ckpt[0] / plain[0]:.3f})")
    if plain[1] is not None:
        print(f"CUDA peak allocated: plain {plain[1] / 2**20:.1f} MiB, checkpointing {ckpt[1] / 2**20:.1f} MiB "
              f"(ratio {ckpt[1] / plain[1]:.3f})")
    print(f"step time: plain {plain[2]:.3f}s, checkpointing {ckpt[2]:.3f}s; max gradient difference {diff:.2e}")


if __name__ == "__main__":
    main()
