"""Checkpoint state is stored without pickle, reads back exactly, and a crafted pickle never runs."""

from __future__ import annotations

import json
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from finetune_cli.checkpoint import load_state, save_state
from finetune_cli.engine.rng import capture_rng, restore_rng
from finetune_cli.errors import CorruptCheckpointError


def test_round_trip_of_every_kind_of_value(tmp_path):
    tree = {"a": torch.arange(6.0).reshape(2, 3), "b": np.array([1, 2**32 - 1], dtype=np.uint32),
            "c": (1, 2.5, "x", None, True), 3: {"nested": [torch.tensor(7, dtype=torch.int64), (0.9, 0.999)]},
            "__odd": float("inf")}
    save_state(tree, tmp_path, "s")
    back = load_state(tmp_path, "s")
    assert set(back) == set(tree) and back[3]["nested"][1] == (0.9, 0.999) and back["c"] == tree["c"]
    assert torch.equal(back["a"], tree["a"]) and torch.equal(back[3]["nested"][0], tree[3]["nested"][0])
    assert back["b"].dtype == np.uint32 and np.array_equal(back["b"], tree["b"]) and back["__odd"] == float("inf")
    # plain data on disk: JSON and safetensors, nothing a loader could execute
    json.loads((tmp_path / "s.json").read_text())
    assert (tmp_path / "s.safetensors").read_bytes()[8:9] == b"{"


def test_rng_states_restore_exactly(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    random.random(), np.random.rand(), torch.rand(1)
    save_state(capture_rng(), tmp_path, "rng")
    expected = (random.random(), np.random.rand(), torch.rand(3))
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    restore_rng(load_state(tmp_path, "rng"))
    got = (random.random(), np.random.rand(), torch.rand(3))
    assert got[:2] == expected[:2] and torch.equal(got[2], expected[2])


def test_optimizer_state_round_trip_continues_identically(tmp_path):
    def make():
        torch.manual_seed(0)
        m = torch.nn.Linear(4, 3)
        return m, torch.optim.AdamW([{"params": [m.weight], "lr": 1e-2}, {"params": [m.bias], "lr": 1e-3,
                                                                          "weight_decay": 0.0}])

    def step(m, opt):
        opt.zero_grad()
        m(torch.ones(2, 4)).pow(2).sum().backward()
        opt.step()

    m1, o1 = make()
    for _ in range(3):
        step(m1, o1)
    save_state(o1.state_dict(), tmp_path, "optimizer")
    m2, o2 = make()
    m2.load_state_dict(m1.state_dict())
    o2.load_state_dict(load_state(tmp_path, "optimizer"))
    step(m1, o1), step(m2, o2)
    assert torch.equal(m1.weight, m2.weight) and torch.equal(m1.bias, m2.bias)


@pytest.mark.parametrize("damage", ["truncate_json", "garbage_tensors", "missing"])
def test_a_damaged_state_is_a_one_line_error_naming_the_file(tmp_path, damage):
    save_state({"w": torch.ones(3)}, tmp_path, "optimizer")
    if damage == "truncate_json":
        p = tmp_path / "optimizer.json"
        p.write_text(p.read_text()[:10])
    elif damage == "garbage_tensors":
        (tmp_path / "optimizer.safetensors").write_bytes(b"\x00garbage")
    else:
        (tmp_path / "optimizer.json").unlink()
    with pytest.raises(CorruptCheckpointError, match=r"optimizer\.(json|safetensors)") as e:
        load_state(tmp_path, "optimizer")
    assert "\n" not in str(e.value)


class _Exploit:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "pwned"))


@pytest.mark.parametrize("name", ["rng-0", "optimizer", "scheduler"])
def test_a_crafted_pickle_in_a_run_directory_never_runs_on_resume(tiny_recipe, tmp_path, name):
    """The attack: replace a checkpoint's state by a pickle (``<name>.pt``), rerun the same train
    command. The pickle is never loaded: the state is missing, and the resume refuses in one line."""
    from finetune_cli.pipelines.recipes import load_plan
    from finetune_cli.pipelines.train import run_train
    from finetune_cli.ui import UI

    plan = load_plan(None, tiny_recipe("train.max_steps=4", "train.save_every=2"))
    run_train(plan, UI(quiet=True), device="cpu")
    run = plan.run_dir
    (run / "summary.json").unlink()
    for ck in run.glob("checkpoint-*"):
        for f in ck.glob(f"{name}.*"):
            f.unlink()
        marker = tmp_path / "marker"
        (ck / f"{name}.pt").write_bytes(pickle.dumps(_Exploit(marker)))
    with pytest.raises(CorruptCheckpointError, match=f"no intact checkpoint .*{name}"):
        run_train(plan, UI(quiet=True), device="cpu")
    assert not (tmp_path / "marker").exists()


def test_new_checkpoints_hold_no_pickle(tiny_recipe, monkeypatch):
    """A run writes no .pt file and resumes with pickle and torch.load unavailable."""
    from finetune_cli.pipelines.recipes import load_plan
    from finetune_cli.pipelines.train import run_train
    from finetune_cli.ui import UI

    def stop(trainer, state):
        if state.step == 2:
            raise KeyboardInterrupt

    r = load_plan(None, tiny_recipe("train.max_steps=4", "train.save_every=2"))
    with pytest.raises(KeyboardInterrupt):
        run_train(r, UI(quiet=True), device="cpu", callbacks=[stop])
    assert not list(r.run_dir.rglob("*.pt")) and not list(r.run_dir.rglob("*.pkl"))

    def refuse(*a, **k):
        raise AssertionError("unpickling during resume")

    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    out = run_train(r, UI(quiet=True), device="cpu")
    assert out.resumed_from is not None and out.summary["steps"] == 4
