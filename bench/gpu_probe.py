"""Diagnostics for a lent GPU (not timings to quote against a peer: bench/train_throughput.py does that).

    python bench/gpu_probe.py left sdpa stacks        # needs: gpu

- ``left``: what finished training runs leave allocated in device memory, one eager run then two
  captured ones (``train.cuda_graphs=on``) in one process: the allocator's figures after each run,
  before and after a garbage collection, and whether the run's ``GraphedStep`` is gone. A run must
  leave nothing of itself; what stays is per-stream library state (cuBLAS keeps a workspace for every
  stream it has run on). On an H200 with a fresh side stream per capture each captured run left
  +0.125 GiB (two captures); with one side stream per process (``engine/device.side_stream``) the
  second captured run should leave no more than the first.
- ``sdpa``: an eager training step of the embedded model (batch 32, bf16 autocast, fused AdamW,
  widths 40-128 with padding masks, every width seen once before the clock) with torch's default
  SDPA backends, without cuDNN's, and with the memory-efficient kernel alone; 3 interleaved repeats.
- ``stacks``: after one captured run, the blocks still allocated, grouped by the Python stack that
  allocated them (``torch.cuda.memory._record_memory_history``).
"""

from __future__ import annotations

import collections
import contextlib
import gc
import statistics
import sys
import time
import weakref
from pathlib import Path

import torch

from finetune_cli.engine import step as step_mod
from finetune_cli.pipelines.recipes import load_plan
from finetune_cli.pipelines.train import run_train
from finetune_cli.ui import UI

QUICKSTART = Path(__file__).resolve().parents[1] / "finetune_cli" / "resources" / "quickstart"
GIB = 2**30


def mem(tag: str) -> None:
    torch.cuda.synchronize()
    print(f"[mem] {tag}: allocated {torch.cuda.memory_allocated() / GIB:.3f} GiB, "
          f"reserved {torch.cuda.memory_reserved() / GIB:.3f}", flush=True)


def train(graphs: str, name: str, steps: int = 20):
    return run_train(load_plan(None, [
        "model.name=embedded", "model.max_length=128", f"data.train={QUICKSTART / 'train.tsv'}", "data.eval=null",
        "data.columns.text=sentence", f"train.max_steps={steps}", "train.batch_size=32",
        f"train.cuda_graphs={graphs}", "output.dir=/tmp/gpu-probe", f"output.name={name}"]),
        UI(quiet=True), device="cuda", overwrite=True)


def left() -> None:
    steps: list[weakref.ref] = []
    real = step_mod.GraphedStep.__init__

    def init(self, *a, **k):
        real(self, *a, **k)
        steps.append(weakref.ref(self))

    step_mod.GraphedStep.__init__ = init
    mem("start")
    for i, graphs in enumerate(["off", "on", "on"]):
        out = train(graphs, f"r{i}")
        print(f"run {i} ({graphs}): cuda_graphs {out.summary.get('cuda_graphs')}, "
              f"peak {out.summary.get('gpu_mem_peak_gb')} GiB", flush=True)
        del out
        mem(f"after run {i} ({graphs}), no collection")
        gc.collect()
        mem(f"after run {i} ({graphs}), collected")
        print(f"  GraphedStep objects alive: {sum(r() is not None for r in steps)}", flush=True)
    torch.cuda.empty_cache()
    mem("after empty_cache")


def sdpa() -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers import AutoModelForSequenceClassification

    from finetune_cli.models.loading import embedded_model_path

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(str(embedded_model_path()), num_labels=2)
    model = model.cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    g = torch.Generator().manual_seed(0)

    def batch(w: int) -> dict:
        ids = torch.randint(1000, 20000, (32, w), generator=g)
        lens = torch.randint(max(1, w - 24), w + 1, (32,), generator=g)
        lens[0] = w
        mask = (torch.arange(w)[None] < lens[:, None]).long()
        return {"input_ids": (ids * mask).cuda(), "attention_mask": mask.cuda(),
                "labels": torch.randint(0, 2, (32,), generator=g).cuda()}

    widths = [40, 56, 72, 88, 104, 128, 48, 64, 80, 96, 112, 120]
    batches = [batch(w) for w in widths * 5]

    def step(b: dict) -> None:
        with torch.autocast("cuda", torch.bfloat16):
            loss = model(**b).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def run(backends) -> float:
        with sdpa_kernel(backends) if backends else contextlib.nullcontext():
            for b in batches[:len(widths)]:  # every width once, off the clock
                step(b)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for b in batches:
                step(b)
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / len(batches) * 1e3

    variants = {"default": None,
                "no cuDNN": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
                "efficient only": [SDPBackend.EFFICIENT_ATTENTION]}
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(3):
        for k, v in variants.items():
            times[k].append(run(v))
    for k, v in times.items():
        print(f"[sdpa] {k:<15} eager step, batch 32, widths 40-128: {statistics.median(v):.2f} ms "
              f"({min(v):.2f}-{max(v):.2f})", flush=True)


def stacks() -> None:
    torch.cuda.memory._record_memory_history(max_entries=200000)
    out = train("on", "stacks", steps=6)
    del out
    gc.collect()
    mem("after a captured run, collected")
    snap = torch.cuda.memory._snapshot()
    count: collections.Counter = collections.Counter()
    size: collections.Counter = collections.Counter()
    for seg in snap["segments"]:
        for b in seg["blocks"]:
            if b["state"] != "active_allocated":
                continue
            frames = [f for f in b.get("frames", []) if f["filename"].endswith(".py")]
            key = " < ".join(f"{f['filename'].split('/')[-1]}:{f['line']}:{f['name']}" for f in frames[:5])
            count[key or "(no Python frame)"] += 1
            size[key or "(no Python frame)"] += b["size"]
    for k, v in size.most_common(8):
        print(f"  {v / 2**20:8.1f} MiB in {count[k]} blocks: {k[:330]}", flush=True)


if __name__ == "__main__":
    for part in sys.argv[1:]:
        t0 = time.time()
        {"left": left, "sdpa": sdpa, "stacks": stacks}[part]()
        print(f"[{part}] {time.time() - t0:.1f} s", flush=True)
