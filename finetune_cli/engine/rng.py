"""Random streams: seed them, capture and restore every one a training step draws from.

Exact resume rests on these: a checkpoint stores :func:`capture_rng` of each rank and a resume
hands it to :func:`restore_rng`, so the resumed steps draw the same dropout masks and noise as a run
that never stopped. A leaf module (nothing from the engine), so the trainer and the distributed
helpers can both use it without importing each other.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture_rng() -> dict[str, Any]:
    """The state of every generator a step draws from: Python, NumPy, torch (CPU) and, once CUDA is
    in use, every CUDA device."""
    st = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def restore_rng(st: dict[str, Any]) -> None:
    """Put back a state from :func:`capture_rng`."""
    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices) with ``seed``."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rank_seed(seed: int, rank: int) -> int:
    """The seed of rank ``rank``'s random stream (dropout, noise). Rank 0 keeps the recipe's seed, so
    a one-process run is what it always was; other ranks get independent streams derived from
    (seed, rank), so their dropout masks are not copies of rank 0's."""
    if rank == 0:
        return seed
    return int(np.random.SeedSequence([seed, rank]).generate_state(1, dtype=np.uint64)[0] % 2**63)
