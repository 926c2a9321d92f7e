"""The class_balanced sampler: every example once, a positive for every anchor whenever the data
allows, classes spread over the epoch, a pure function of (seed, epoch)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from finetune_cli.data.sampling import SAMPLERS, epoch_batches

balanced = SAMPLERS["class_balanced"]


def _labels(counts, seed=0):
    lab = np.concatenate([np.full(n, c) for c, n in enumerate(counts)])
    return np.random.default_rng(seed).permutation(lab)


CASES = [((8, 8), 4), ((7, 20, 3), 8), ((1, 5, 2, 9), 6), ((50, 3), 16), ((5, 5, 5), 2), ((3, 3), 3)]


@pytest.mark.parametrize("counts,bs", CASES)
def test_each_example_once_and_batch_sizes(counts, bs):
    lab = _labels(counts)
    batches = balanced(np.ones(len(lab)), lab, bs, 7, 0)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(lab)))
    assert all(1 <= len(b) <= bs for b in batches)
    # groups are packed whole, so a batch is at most two short of full (a pair or a triple left
    # over), except the one partial batch at the end of the packing (shuffled to anywhere)
    assert all(n >= bs - 2 for n in sorted(len(b) for b in batches)[1:]) or bs <= 3


@pytest.mark.parametrize("counts,bs", CASES)
def test_every_anchor_has_a_positive_when_its_class_allows(counts, bs):
    lab = _labels(counts)
    for epoch in range(3):
        for b in balanced(np.ones(len(lab)), lab, bs, 3, epoch):
            c = Counter(lab[b].tolist())
            for i in b:
                if counts[lab[i]] >= 2 and bs >= 2 and not (bs == 2 and counts[lab[i]] % 2 == 1):
                    assert c[lab[i]] >= 2, (b, lab[b])


def test_random_batches_often_leave_anchors_alone_which_is_why_it_exists():
    """Guard against the test above passing trivially: on the same data random batches fail it."""
    lab = _labels((5, 5, 5, 5, 5))
    alone = 0
    for epoch in range(5):
        for b in SAMPLERS["random"](np.ones(len(lab)), lab, 6, 3, epoch):
            c = Counter(lab[b].tolist())
            alone += sum(c[lab[i]] == 1 for i in b)
        for b in balanced(np.ones(len(lab)), lab, 6, 3, epoch):
            c = Counter(lab[b].tolist())
            assert all(c[lab[i]] >= 2 for i in b)
    assert alone > 0


def test_batches_mix_classes_and_spread_them_over_the_epoch():
    lab = _labels((40, 40, 40))
    batches = balanced(np.ones(len(lab)), lab, 12, 0, 0)
    for b in batches:
        per_class = Counter(lab[b].tolist())
        assert len(per_class) == 3 and max(per_class.values()) <= 6  # about 4 of each


def test_minority_class_is_spread_not_bunched():
    lab = _labels((90, 10))
    batches = balanced(np.ones(len(lab)), lab, 10, 1, 0)
    with_minority = sum(1 in lab[b].tolist() for b in batches)
    assert with_minority >= 4  # 5 pairs of the minority land in (nearly) 5 different batches


def test_pure_function_of_seed_and_epoch():
    lab = _labels((13, 17, 6))
    L = np.arange(len(lab))
    assert balanced(L, lab, 8, 5, 2) == balanced(L, lab, 8, 5, 2)
    assert balanced(L, lab, 8, 5, 2) != balanced(L, lab, 8, 5, 3)
    assert balanced(L, lab, 8, 5, 2) != balanced(L, lab, 8, 6, 2)


def test_without_labels_or_with_batch_size_one_falls_back_to_random():
    L = np.ones(10)
    assert balanced(L, None, 4, 1, 0) == SAMPLERS["random"](L, None, 4, 1, 0)
    lab = _labels((5, 5))
    assert balanced(L, lab, 1, 1, 0) == SAMPLERS["random"](L, lab, 1, 1, 0)


def test_split_across_processes_keeps_every_batch_whole():
    lab = _labels((11, 9, 6))
    L = np.ones(len(lab))
    full = balanced(L, lab, 6, 0, 0)
    r0 = epoch_batches("class_balanced", L, lab, 6, 0, 0, rank=0, world=2)
    r1 = epoch_batches("class_balanced", L, lab, 6, 0, 0, rank=1, world=2)
    assert len(r0) == len(r1) and r0 + r1 and all(b in full for b in r0 + r1)


@pytest.mark.parametrize("name", ["random", "length_grouped", "class_balanced"])
@pytest.mark.parametrize("world", [2, 3])
def test_uneven_batches_are_padded_so_every_example_is_seen_once(name, world):
    """41 examples in batches of 4 (11 batches) on 2 or 3 processes: every process gets ceil(11/N)
    batches; the real ones are the one-process epoch's batches, each once (nothing dropped); the
    rest are ``Padding`` copies of real batches, last on a rank and never on rank 0."""
    from finetune_cli.data.sampling import Padding

    lab = _labels((21, 20))
    L = np.random.default_rng(0).integers(3, 30, len(lab))
    full = epoch_batches(name, L, lab, 4, 7, 1)
    assert full == SAMPLERS[name](L, lab, 4, 7, 1) and len(full) == 11  # one process: unchanged
    ranks = [epoch_batches(name, L, lab, 4, 7, 1, rank=r, world=world) for r in range(world)]
    assert {len(b) for b in ranks} == {-(-11 // world)}
    real = [b for bs in ranks for b in bs if not isinstance(b, Padding)]
    assert sorted(real) == sorted(full) and sorted(i for b in real for i in b) == list(range(41))
    pads = [(r, k) for r, bs in enumerate(ranks) for k, b in enumerate(bs) if isinstance(b, Padding)]
    assert len(pads) == -11 % world and all(r > 0 and k == len(ranks[r]) - 1 for r, k in pads)
    assert all(list(ranks[r][k]) in full for r, k in pads)


def _padded_tokens(batches, lengths):
    return sum(len(b) * int(lengths[b].max()) for b in batches)


def test_length_grouping_keeps_padding_low_and_positives_present():
    rng = np.random.default_rng(0)
    lab = _labels((300, 200, 100))
    L = rng.integers(3, 60, size=len(lab))
    grouped = balanced(L, lab, 16, 0, 0)
    ungrouped = SAMPLERS["class_balanced_ungrouped"](L, lab, 16, 0, 0)
    for batches in (grouped, ungrouped):
        assert sorted(i for b in batches for i in b) == list(range(len(lab)))
        for b in batches:
            c = Counter(lab[b].tolist())
            assert all(c[lab[i]] >= 2 for i in b)
    # grouped pads far less than the stratified order (which pads like random batches)
    assert _padded_tokens(grouped, L) < 0.7 * _padded_tokens(ungrouped, L)
    assert _padded_tokens(ungrouped, L) > 0.9 * _padded_tokens(SAMPLERS["random"](L, lab, 16, 0, 0), L)
    # the ungrouped variant keeps every batch close to the data's class proportions
    for b in ungrouped[:-1]:
        c = Counter(lab[b].tolist())
        assert len(c) >= 2 and c[0] >= 4 and c[2] <= 6  # expected per batch: 8, 5.3, 2.7


def test_group_by_length_false_switches_to_the_ungrouped_variant(tiny_recipe, monkeypatch):
    from finetune_cli.data import sampling
    from finetune_cli.engine import trainer as tr
    from finetune_cli.pipelines.recipes import load_plan
    from finetune_cli.pipelines.train import run_train
    from finetune_cli.ui import UI

    assert sampling.UNGROUPED["class_balanced"] in SAMPLERS and sampling.UNGROUPED["length_grouped"] in SAMPLERS
    used = []
    real = tr.epoch_batches

    def spy(name, *a, **k):
        used.append(name)
        return real(name, *a, **k)

    monkeypatch.setattr(tr, "epoch_batches", spy)
    run_train(load_plan(None, tiny_recipe("objective.name=scl", "data.group_by_length=false", "train.max_steps=1")),
              UI(quiet=True), device="cpu")
    assert set(used) == {"class_balanced_ungrouped"}
