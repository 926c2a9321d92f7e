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


def _class_groups(lengths: np.ndarray, labels: np.ndarray, batch_size: int, rng: np.random.Generator,
                  mega: Optional[int]) -> tuple[list[list[int]], np.ndarray]:
    """Same-class groups of 2 (3 for a class's odd one out, 1 for a class of one) and their
    stratified keys. With ``mega``, each class's shuffled examples are sorted by length in chunks
    of ``mega * batch_size`` before pairing, so the two of a pair have similar lengths."""
    groups: list[list[int]] = []
    keys: list[float] = []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        if mega:
            size = mega * batch_size
            idx = np.concatenate([ch[np.argsort(-lengths[ch], kind="stable")]
                                  for ch in np.split(idx, range(size, len(idx), size))])
        cut = [idx[i:i + 2].tolist() for i in range(0, len(idx), 2)]
        if len(cut) > 1 and len(cut[-1]) == 1:
            cut[-2].extend(cut.pop())
        # the k-th of a class's n groups (in random order) gets key (k + u) / n: every class is
        # spread evenly over the epoch
        order = rng.permutation(len(cut))
        u = rng.random(len(cut))
        groups.extend(cut[k] for k in order)
        keys.extend(((np.arange(len(cut)) + u) / len(cut)).tolist())
    return groups, np.asarray(keys)


def _pack(groups: list[list[int]], batch_size: int) -> Batches:
    """Whole groups into batches of at most ``batch_size`` (a group too large for one is split)."""
    batches: Batches = []
    cur: list[int] = []
    for g in groups:
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


def _class_balanced(lengths: np.ndarray, labels: Optional[np.ndarray], batch_size: int, seed: int, epoch: int,
                    mega: Optional[int]) -> Batches:
    if labels is None or batch_size < 2:
        return random_batches(lengths, labels, batch_size, seed, epoch)
    rng = _rng(seed, epoch)
    labels = np.asarray(labels)
    groups, keys = _class_groups(lengths, labels, batch_size, rng, mega)
    ordered = [groups[i] for i in np.argsort(keys, kind="stable")]
    if not mega:
        return _pack(ordered, batch_size)
    # Length grouping as in `length_grouped`: cut the stratified sequence into mega-batches, sort
    # each by group length (classes stay mixed inside a mega-batch), pack, shuffle batch order.
    size, chunks, cur, n = mega * batch_size, [], [], 0
    for g in ordered:
        cur.append(g)
        n += len(g)
        if n >= size:
            chunks.append(cur)
            cur, n = [], 0
    if cur:
        chunks.append(cur)
    flat: list[list[int]] = []
    for ch in chunks:
        flat.extend(sorted(ch, key=lambda g: -int(lengths[g].max())))
    batches = _pack(flat, batch_size)
    return [batches[i] for i in rng.permutation(len(batches))]


@sampler("class_balanced")
def class_balanced_batches(lengths: np.ndarray, labels: Optional[np.ndarray], batch_size: int, seed: int,
                           epoch: int, mega: int = 50) -> Batches:
    """Batches in which every example has a same-class partner, classes mixed, lengths grouped.

    For in-batch contrastive objectives (``scl``, ``core_tuning``): an anchor without a positive
    in its batch teaches nothing, and with few-shot data and small batches random batches often
    leave anchors alone. Each class's examples are shuffled and cut into pairs of similar length
    (an odd count makes the class's last group a triple; a class of one stays alone). Groups are
    ordered by a jittered stratified key — the k-th of a class's n groups gets ``(k + u) / n``,
    u ~ U(0, 1) — so every class is spread evenly over the epoch. As in ``length_grouped`` the
    sequence is cut into mega-batches of ``mega`` batches, each sorted by length, packed into
    batches (whole groups, so a batch may be one or two short of ``batch_size``) and the batch
    order shuffled: batches pad little and, unless lengths differ by class, mix classes in about
    their data proportions.

    Every example is seen exactly once per epoch; the result is a pure function of
    ``(seed, epoch)``. The number of batches may differ by one or two between epochs.
    Without labels, or with ``batch_size < 2``, this is the ``random`` sampler.
    """
    return _class_balanced(lengths, labels, batch_size, seed, epoch, mega)


@sampler("class_balanced_ungrouped")
def class_balanced_ungrouped_batches(lengths: np.ndarray, labels: Optional[np.ndarray], batch_size: int, seed: int,
                                     epoch: int) -> Batches:
    """``class_balanced`` without length grouping (``data.group_by_length: false``): batches in
    stratified order, so each mixes classes in their data proportions whatever the lengths."""
    return _class_balanced(lengths, labels, batch_size, seed, epoch, None)


# What `data.group_by_length: false` turns a sampler into.
UNGROUPED = {"length_grouped": "random", "class_balanced": "class_balanced_ungrouped"}


class Padding(list):
    """A batch of repeated examples that only keeps the processes in step (see ``epoch_batches``):
    the trainer gives it zero loss weight, and contrastive objectives leave it out of the batch they
    gather across processes."""


def epoch_batches(name: str, lengths: np.ndarray, labels: Optional[np.ndarray], batch_size: int, seed: int,
                  epoch: int, rank: int = 0, world: int = 1) -> Batches:
    """The batches this process trains on in ``epoch``: every ``world``-th global batch. When the
    global batches do not divide by ``world``, the last round is filled up with :class:`Padding`
    copies of the epoch's first batches (accelerate's ``even_batches`` idea), so all processes take
    the same number of steps and every example is trained on once per epoch, whatever ``world``.
    Only the highest ranks get a padding batch, the last of their epoch; never rank 0."""
    batches = SAMPLERS[name](lengths, labels, batch_size, seed, epoch)
    if world > 1:
        batches = batches + [Padding(batches[i % len(batches)]) for i in range(-len(batches) % world)]
        batches = batches[rank::world]
    return batches


def sorted_batches(lengths: np.ndarray, batch_size: int) -> Batches:
    """Evaluation batches: longest first, so padding is minimal; callers restore the order."""
    order = np.argsort(-lengths, kind="stable")
    return [order[i:i + batch_size].tolist() for i in range(0, len(order), batch_size)]
