"""Where a run trains, in words, and how much GPU memory it holds.

``describe(device)``: ``cuda:0 NVIDIA H100 80GB HBM3`` or ``cpu ×2 threads``. ``memory(device)``: on
CUDA, ``{"gpu_mem_gb": allocated now, "gpu_mem_peak_gb": peak since the run started}`` in GiB
(PyTorch's caching allocator: tensors held, not the cache ``nvidia-smi`` shows); None elsewhere.
The trainer calls these through the module so tests can fake a GPU with ``monkeypatch``.
"""

from __future__ import annotations

from typing import Optional

import torch

GIB = 2**30


def describe(device: torch.device) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{idx} {torch.cuda.get_device_name(idx)}"
    if device.type == "cpu":
        return f"cpu ×{torch.get_num_threads()} threads"
    return str(device)


def reset_peak(device: torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def memory(device: torch.device) -> Optional[dict[str, float]]:
    if torch.device(device).type != "cuda":
        return None
    return {"gpu_mem_gb": round(torch.cuda.memory_allocated(device) / GIB, 3),
            "gpu_mem_peak_gb": round(torch.cuda.max_memory_allocated(device) / GIB, 3)}


def memory_text(mem: Optional[dict[str, float]]) -> str:
    """``mem 1.20/3.40 GB`` (now/peak) for the progress line; empty off CUDA."""
    if not mem:
        return ""
    return f"mem {mem['gpu_mem_gb']:.2f}/{mem['gpu_mem_peak_gb']:.2f} GB"
