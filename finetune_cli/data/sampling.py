"""Batch samplers. Each returns the list of batches (lists of example indices) of one epoch, a
pure function of ``(seed, epoch)``: that is what makes exact resume possible — a resumed run
rebuilds the same epoch and skips the batches it already trained on.

Objectives name the sampler they need (``Objective.sampler``); the engine looks it up here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import numpy as np

Batches = list[list[int]]
SamplerFn = Callable[..., Batches]
SAMPLERS: dict[str, SamplerFn] = {}


def sampler(name: str):
    def deco(fn: SamplerFn) -> SamplerFn:
        SAMPLERS[name] = fn
        return fn
    return deco


def _rng(seed: int, epoch: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch])


@sampler("random")
def random_batches(lengths: np.ndarray, labels: Optional[np.ndarray], batch_size: int, seed: int, epoch: int,
                   ) -> Batches:
    perm = _rng(seed, epoch).permutation(len(lengths))
    return [perm[i:i + batch_size].tolist() for i in range(0, len(perm), batch_size)]


@sampler("length_grouped")
def length_grouped_batches(lengths: np.ndarray, labels: Optional[np.ndarray], batch_size: int, seed: int,
                           epoch: int, mega: int = 50) -> Batches:
    """Shuffle, cut into mega-batches of ``mega`` batches, sort each by length, cut into batches,
    then shuffle the batch order. Every example is seen once per epoch; batches hold similar
    lengths, so dynamic padding wastes little (the Hugging Face ``group_by_length`` idea)."""
    rng = _rng(seed, epoch)
    perm = rng.permutation(len(lengths))
    size = batch_size * mega
    batches: Batches = []
    for start in range(0, len(perm), size):
        chunk = perm[start:start + size]
        chunk = chunk[np.argsort(-lengths[chunk], kind="stable")]
        batches.extend(chunk[i:i + batch_size].tolist() for i in range(0, len(chunk), batch_size))
    order = rng.permutation(len(batches))
    return [batches[i] for i in order]


def epoch_batches(name: str, lengths: np.ndarray, labels: Optional[np.ndarray], batch_size: int, seed: int,
                  epoch: int, rank: int = 0, world: int = 1) -> Batches:
    """The batches this process trains on in ``epoch``: every ``world``-th global batch, with the
    tail trimmed so all processes take the same number of steps."""
    batches = SAMPLERS[name](lengths, labels, batch_size, seed, epoch)
    if world > 1:
        usable = len(batches) - len(batches) % world
        batches = batches[rank:usable:world]
    return batches


def sorted_batches(lengths: np.ndarray, batch_size: int) -> Batches:
    """Evaluation batches: longest first, so padding is minimal; callers restore the order."""
    order = np.argsort(-lengths, kind="stable")
    return [order[i:i + batch_size].tolist() for i in range(0, len(order), batch_size)]
