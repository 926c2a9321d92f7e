"""A finished training run leaves nothing of itself in memory: no reference cycle holds its model,
gradients or optimizer state until a garbage collection (on a GPU that memory is device memory, and
the next run in the process, a sweep's trial or a seed, would train beside it: the bench measured
~3x the weights' size more peak memory than the Trainer's until this was fixed)."""

from __future__ import annotations

import gc
import weakref

import torch

from finetune_cli.pipelines.recipes import load_plan
from finetune_cli.pipelines.train import run_train
from finetune_cli.ui import UI


def test_a_finished_run_is_freed_by_reference_counting_alone(tiny_recipe, monkeypatch):
    made: list[weakref.ref] = []
    real_init = torch.optim.AdamW.__init__

    def init(self, *a, **k):
        real_init(self, *a, **k)
        made.append(weakref.ref(self))

    monkeypatch.setattr(torch.optim.AdamW, "__init__", init)
    # A first run in this process: what it imports for the first time may leave cycles (caught
    # exceptions holding frames) that a collection clears; the run after it must leave none.
    run_train(load_plan(None, tiny_recipe("train.max_steps=2", "output.name=first")), UI(quiet=True),
              device="cpu")
    gc.collect()
    gc.disable()
    try:
        out = run_train(load_plan(None, tiny_recipe("train.max_steps=2", "output.name=second")), UI(quiet=True),
                        device="cpu")
        assert out.summary["steps"] == 2
        del out
        alive = [r() for r in made if r() is not None]
        assert not alive, f"{len(alive)} optimizer(s) still alive after the run returned"
    finally:
        gc.enable()
