"""The training engine: run layout, exact resume after Ctrl-C or a crash, NaN handling, atomic saves."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from finetune_cli.engine.trainer import Trainer
from finetune_cli.errors import TrainingError
from finetune_cli.pipelines.recipes import load_plan
from finetune_cli.pipelines.train import run_train
from finetune_cli.ui import UI


def _weights(d):
    w = load_file(str(d / "model.safetensors"))  # a native classifier: the head is in here
    assert "classifier.weight" in w
    if (d / "finetune_head.safetensors").is_file():  # projection heads, spectral-norm state
        w.update({f"head.{k}": v for k, v in load_file(str(d / "finetune_head.safetensors")).items()})
    return w


def _assert_same_weights(a, b):
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


def _train(overrides, callbacks=()):
    return run_train(load_plan(None, overrides), UI(quiet=True), device="cpu", callbacks=callbacks)


def test_run_directory_layout(tiny_recipe):
    out = _train(tiny_recipe("train.eval_every=4"))
    d = out.run_dir
    for name in ("recipe.yaml", "metrics.jsonl", "summary.json", "best/config.json", "final/config.json",
                 "final/model.safetensors", "final/README.md", "final/tokenizer.json"):
        assert (d / name).exists(), name
    cfg = json.loads((d / "final" / "config.json").read_text())
    # a native transformers classifier: nothing of it lives outside model.safetensors
    assert cfg["architectures"] == ["BertForSequenceClassification"]
    assert cfg["problem_type"] == "single_label_classification"
    assert not (d / "final" / "finetune_head.safetensors").exists()
    assert cfg["id2label"] == {"0": "negative", "1": "positive"}
    assert cfg["label2id"] == {"negative": 0, "positive": 1}
    lines = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert any("ce" in x and "loss" in x and "lr" in x for x in lines)
    assert sum("eval/accuracy" in x for x in lines) == 2  # steps 4 and 8
    s = json.loads((d / "summary.json").read_text())
    assert s["steps"] == 8 and s["best_step"] in (4, 8)
    assert len(list(d.glob("checkpoint-*"))) <= 2


class _StopAt:
    def __init__(self, step, exc):
        self.step, self.exc = step, exc

    def __call__(self, trainer: Trainer, state):
        if state.step == self.step:
            raise self.exc


@pytest.mark.parametrize("how", ["ctrl_c", "crash"])
def test_interrupted_then_resumed_equals_uninterrupted(tiny_recipe, tmp_path, how):
    common = ("train.epochs=2", "train.eval_every=3", "train.save_every=1", "train.grad_accum=2",
              "train.batch_size=4")
    ref = _train(tiny_recipe(*common, f"output.dir={tmp_path / 'ref'}"))

    run = tiny_recipe(*common, f"output.dir={tmp_path / 'cut'}")
    exc = KeyboardInterrupt() if how == "ctrl_c" else RuntimeError("simulated crash")
    with pytest.raises(KeyboardInterrupt if how == "ctrl_c" else RuntimeError):
        _train(run, callbacks=[_StopAt(5, exc)])
    assert not (tmp_path / "cut" / "tiny" / "summary.json").exists()
    resumed = _train(run)  # same command again: auto-resume from the newest checkpoint
    assert resumed.resumed_from is not None and resumed.resumed_from.name == "checkpoint-5"

    _assert_same_weights(ref.run_dir / "final", resumed.run_dir / "final")
    assert resumed.summary["final_eval"] == ref.summary["final_eval"]
    assert resumed.summary["steps"] == ref.summary["steps"] == 16
    ref_lines = [json.loads(x) for x in (ref.run_dir / "metrics.jsonl").read_text().splitlines()]
    cut_lines = [json.loads(x) for x in (resumed.run_dir / "metrics.jsonl").read_text().splitlines()]
    strip = lambda ls: [{k: v for k, v in x.items() if k != "samples_per_s"} for x in ls]  # noqa: E731
    assert strip(cut_lines) == strip(ref_lines)


def test_ctrl_c_mid_accumulation_resumes_exactly(tiny_recipe, tmp_path):
    """Interrupt inside a step (between micro-batches): the checkpoint must replay that step."""
    common = ("train.max_steps=6", "train.grad_accum=2", "train.batch_size=4", "train.save_every=100")
    ref = _train(tiny_recipe(*common, f"output.dir={tmp_path / 'ref'}"))
    run = tiny_recipe(*common, f"output.dir={tmp_path / 'cut'}")
    from finetune_cli.objectives.ce import CrossEntropy

    calls = {"n": 0}
    orig = CrossEntropy.forward

    def flaky(self, model, batch):
        calls["n"] += 1
        if calls["n"] == 7:  # first micro-batch of step 4
            raise KeyboardInterrupt
        return orig(self, model, batch)

    CrossEntropy.forward = flaky
    try:
        with pytest.raises(KeyboardInterrupt):
            _train(run)
    finally:
        CrossEntropy.forward = orig
    assert (tmp_path / "cut" / "tiny" / "checkpoint-3").is_dir()
    resumed = _train(run)
    _assert_same_weights(ref.run_dir / "final", resumed.run_dir / "final")


def test_nan_loss_stops_with_step_and_keeps_checkpoint(tiny_recipe, tmp_path):
    from finetune_cli.objectives.ce import CrossEntropy

    orig = CrossEntropy.forward
    calls = {"n": 0}

    def poisoned(self, model, batch):
        calls["n"] += 1
        out = orig(self, model, batch)
        if calls["n"] == 4:
            out["loss"] = out["loss"] * float("nan")
        return out

    CrossEntropy.forward = poisoned
    try:
        with pytest.raises(TrainingError, match=r"loss is nan at step 4 .*checkpoint-3"):
            _train(tiny_recipe("train.save_every=1"))
    finally:
        CrossEntropy.forward = orig
    d = tmp_path / "runs" / "tiny"
    assert (d / "checkpoint-3" / "trainer_state.json").is_file()
    assert not (d / "checkpoint-4").exists() and not (d / "summary.json").exists()


def test_failed_checkpoint_write_leaves_nothing_half_written(tiny_recipe, tmp_path, monkeypatch):
    import finetune_cli.checkpoint as tr

    real_save = tr.save_state
    state = {"n": 0}

    def failing_save(obj, directory, name):
        if name == "scheduler":
            state["n"] += 1
            if state["n"] == 2:
                raise OSError("disk full")
        return real_save(obj, directory, name)

    monkeypatch.setattr(tr, "save_state", failing_save)
    from finetune_cli.errors import OutputError

    with pytest.raises(OutputError, match="checkpoint-4"):
        _train(tiny_recipe("train.save_every=2"))
    d = tmp_path / "runs" / "tiny"
    names = sorted(p.name for p in d.iterdir())
    assert "checkpoint-2" in names and "checkpoint-4" not in names
    assert not [n for n in names if n.endswith(".tmp")]
    monkeypatch.setattr(tr, "save_state", real_save)
    out = _train(tiny_recipe("train.save_every=2"))
    assert out.resumed_from.name == "checkpoint-2" and out.summary["steps"] == 8


def test_early_stopping(tiny_recipe):
    out = _train(tiny_recipe("train.epochs=20", "train.eval_every=1", "train.early_stopping_patience=2",
                             "train.lr=1e-9", "train.head_lr=1e-9", "train.metric=accuracy"))
    assert out.summary["stopped_early"] is True
    assert out.summary["steps"] < out.summary["total_steps"]


def test_completed_run_is_not_retrained(tiny_recipe):
    first = _train(tiny_recipe())
    again = _train(tiny_recipe())
    assert again.already_complete and again.summary == first.summary


def test_consecutive_runs_with_different_precision_in_one_process(tiny_recipe, tmp_path):
    """accelerate's state is process-wide; a second run with other settings must still work."""
    a = _train(tiny_recipe("train.max_steps=2", "train.precision=fp32", f"output.dir={tmp_path / 'a'}"))
    b = _train(tiny_recipe("train.max_steps=2", "train.precision=bf16", f"output.dir={tmp_path / 'b'}"))
    assert a.summary["precision"] == "no" and b.summary["precision"] == "bf16"


@pytest.mark.parametrize("during", ["training step 4's evaluation", "the final evaluation"])
def test_ctrl_c_during_an_evaluation_loses_nothing(tiny_recipe, tmp_path, monkeypatch, during):
    """Ctrl-C while evaluating: the resumed run reruns that evaluation, so metrics.jsonl, best/ and
    final/ equal an uninterrupted run's (the README promises the same weights *and metrics*)."""
    import finetune_cli.engine.trainer as tr

    def metrics_lines(run):
        return [{k: v for k, v in json.loads(x).items() if k != "samples_per_s"}
                for x in (run / "metrics.jsonl").read_text().splitlines()]

    ref = _train(tiny_recipe("train.eval_every=2", "output.name=ref")).run_dir
    calls = {"n": 0}
    stop_at = 2 if during.startswith("training") else 4  # 4 evaluations: steps 2, 4, 6, 8
    real = tr.Trainer._evaluate

    def interrupting(self, progress):
        calls["n"] += 1
        if calls["n"] == stop_at:
            self.evaluate_fn(self.unwrapped())  # half-way: the metrics were computed, nothing recorded
            raise KeyboardInterrupt
        return real(self, progress)

    monkeypatch.setattr(tr.Trainer, "_evaluate", interrupting)
    with pytest.raises(KeyboardInterrupt):
        _train(tiny_recipe("train.eval_every=2", "output.name=cut"))
    monkeypatch.setattr(tr.Trainer, "_evaluate", real)
    out = _train(tiny_recipe("train.eval_every=2", "output.name=cut"))
    assert out.resumed_from is not None
    assert metrics_lines(out.run_dir) == metrics_lines(ref)
    _assert_same_weights(out.run_dir / "best", ref / "best")
    _assert_same_weights(out.run_dir / "final", ref / "final")
    s, r = (json.loads((d / "summary.json").read_text()) for d in (out.run_dir, ref))
    assert (s["best_step"], s["best_metric"]) == (r["best_step"], r["best_metric"])
def test_adamw_is_fused_on_cpu(tiny_recipe):
    """The fused AdamW kernel (one pass over all parameters) is used on the CPU too."""
    seen = {}

    def grab(trainer, state):
        opt = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # accelerate's wrapper
        seen["fused"] = opt.defaults.get("fused")

    _train(tiny_recipe("train.max_steps=1"), callbacks=[grab])
    assert seen["fused"] is True


def test_prefetch_gives_the_same_batches_and_weights(tiny_recipe, tmp_path, monkeypatch):
    """The next batch is built in a background thread; the run must equal one without prefetch."""
    import threading

    import finetune_cli.engine.trainer as tr
    import finetune_cli.pipelines.train as pt

    common = ("train.epochs=2", "train.grad_accum=2", "train.batch_size=4", "train.eval_every=5")
    seen: dict[str, list] = {"thread": [], "index": []}
    real_collate = tr.collate

    def spy(data, idx, *a, **k):
        seen["thread"].append(threading.current_thread() is threading.main_thread())
        seen["index"].append(list(idx))
        return real_collate(data, idx, *a, **k)

    monkeypatch.setattr(tr, "collate", spy)
    on = _train(tiny_recipe(*common, f"output.dir={tmp_path / 'on'}"))
    assert not any(seen["thread"])  # every training batch was built off the main thread
    on_batches = seen["index"]
    seen = {"thread": [], "index": []}

    class NoPrefetch(Trainer):
        def __init__(self, *a, **k):
            super().__init__(*a, prefetch=False, **k)

    monkeypatch.setattr(pt, "Trainer", NoPrefetch)
    off = _train(tiny_recipe(*common, f"output.dir={tmp_path / 'off'}"))
    assert all(seen["thread"])
    assert seen["index"] == on_batches
    _assert_same_weights(on.run_dir / "final", off.run_dir / "final")
    strip = lambda p: [{k: v for k, v in json.loads(x).items() if k != "samples_per_s"}  # noqa: E731
                       for x in (p / "metrics.jsonl").read_text().splitlines()]
    assert strip(on.run_dir) == strip(off.run_dir)


def _poison_ce_at(call: int):
    from finetune_cli.objectives.ce import CrossEntropy

    orig = CrossEntropy.forward
    calls = {"n": 0}

    def poisoned(self, model, batch):
        calls["n"] += 1
        out = orig(self, model, batch)
        if calls["n"] == call:
            out["loss"] = out["loss"] * float("nan")
        return out

    return CrossEntropy, orig, poisoned


def test_deferred_nan_check_names_first_bad_step_and_saves_nothing_after_it(tiny_recipe, tmp_path):
    """Losses are read every log_every steps, but the check still runs before any save or
    evaluation: the error names the first bad step (5), the last checkpoint before it (4), and no
    checkpoint holds weights trained past it."""
    cls, orig, poisoned = _poison_ce_at(5)
    cls.forward = poisoned
    try:
        with pytest.raises(TrainingError, match=r"loss is nan at step 5 \(epoch 1\).*checkpoint-4$"):
            _train(tiny_recipe("train.log_every=100", "train.save_every=2", "train.eval_every=100"))
    finally:
        cls.forward = orig
    d = tmp_path / "runs" / "tiny"
    assert (d / "checkpoint-4").is_dir() and not (d / "checkpoint-6").exists()
    assert not (d / "summary.json").exists()


def test_deferred_nan_check_without_checkpoints(tiny_recipe, tmp_path):
    cls, orig, poisoned = _poison_ce_at(2)
    cls.forward = poisoned
    try:
        with pytest.raises(TrainingError, match=r"loss is nan at step 2 .*checkpoint: none"):
            _train(tiny_recipe("train.log_every=6", "train.save_every=100", "train.eval_every=100"))
    finally:
        cls.forward = orig
    assert not list((tmp_path / "runs" / "tiny").glob("checkpoint-*"))


def test_losses_reach_the_host_only_at_log_eval_and_save_points(tiny_recipe, monkeypatch):
    """No host sync per step: the engine reads its losses once per log/eval/save point."""
    import sys

    real = torch.Tensor.tolist
    reads = {"n": 0}

    def counting(self):
        if sys._getframe(1).f_code.co_filename.endswith("engine/trainer.py"):
            reads["n"] += 1
        return real(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counting)
    out = _train(tiny_recipe("train.max_steps=8", "train.log_every=4", "train.eval_every=100",
                             "train.save_every=100"))
    assert out.summary["steps"] == 8
    assert reads["n"] == 2  # steps 4 and 8


@pytest.mark.slow  # inductor compiles forward and backward: about a minute on 2 CPU cores
def test_compile_trains_to_the_same_losses(tiny_recipe, tmp_path):
    """train.compile=true (torch.compile, widths in buckets of 16) follows the eager run's losses."""
    common = ("train.max_steps=6", "train.log_every=1", "model.dropout=0.0", "train.eval_every=100")
    eager = _train(tiny_recipe(*common, f"output.dir={tmp_path / 'eager'}"))
    comp = _train(tiny_recipe(*common, "train.compile=true", f"output.dir={tmp_path / 'comp'}"))
    losses = lambda o: [json.loads(x)["loss"] for x in (o.run_dir / "metrics.jsonl").read_text().splitlines()  # noqa: E731
                        if "loss" in json.loads(x)]
    a, b = losses(eager), losses(comp)
    assert len(a) == len(b) == 6
    assert a == pytest.approx(b, rel=1e-3, abs=1e-4)
