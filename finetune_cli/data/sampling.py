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


@sampler("class_balanced")
def class_balanced_batches(lengths: np.ndarray, labels: Optional[np.ndarray], batch_size: int, seed: int,
                           epoch: int) -> Batches:
    """Batches in which every example has a same-class partner, with classes spread evenly.

    For in-batch contrastive objectives (``scl``, ``core_tuning``): an anchor without a positive
    in its batch teaches nothing, and with few-shot data and small batches random batches often
    leave anchors alone. Each class's examples are shuffled and cut into pairs (an odd count makes
    its last group a triple; a class with one example stays alone). Groups are ordered by a
    jittered stratified key — the k-th of a class's n groups gets ``(k + u) / n`` with u ~ U(0, 1)
    — so every class is spread evenly over the epoch and each batch mixes classes in about their
    data proportions. Groups are packed whole into batches of at most ``batch_size`` (so a batch
    may be one or two short); a group larger than ``batch_size`` is split.

    Every example is seen exactly once per epoch; the result is a pure function of
    ``(seed, epoch)``. No length grouping: batches pad to their longest member.
    Without labels, or with ``batch_size < 2``, this is the ``random`` sampler.
    """
    if labels is None or batch_size < 2:
        return random_batches(lengths, labels, batch_size, seed, epoch)
    rng = _rng(seed, epoch)
    labels = np.asarray(labels)
    groups: list[list[int]] = []
    keys: list[float] = []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c)).tolist()
        cut = [idx[i:i + 2] for i in range(0, len(idx), 2)]
        if len(cut) > 1 and len(cut[-1]) == 1:
            cut[-2].extend(cut.pop())
        u = rng.random(len(cut))
        groups.extend(cut)
        keys.extend(((np.arange(len(cut)) + u) / len(cut)).tolist())
    order = np.argsort(np.asarray(keys), kind="stable")
    batches: Batches = []
    cur: list[int] = []
    for gi in order:
        g = groups[gi]
        if len(cur) + len(g) > batch_size and cur:
            batches.append(cur)
            cur = []
        while len(g) > batch_size:  # only when batch_size is 2 and g a triple
            batches.append(g[:batch_size])
            g = g[batch_size:]
        cur = cur + g
    if cur:
        batches.append(cur)
    return batches


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
