"""Optimizers, learning-rate schedules and gradient checkpointing (``train.optimizer``,
``train.lr_scheduler``, ``train.warmup_steps``, ``train.gradient_checkpointing``), and the
did-you-mean that points transformers' ``TrainingArguments`` names at ours."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from typer.testing import CliRunner

from finetune_cli.cli.main import app
from finetune_cli.pipelines.recipes import load_plan
from finetune_cli.pipelines.train import run_train
from finetune_cli.ui import UI
from tests.unit.test_engine import _assert_same_weights, _StopAt

runner = CliRunner()


def _train(overrides, callbacks=()):
    return run_train(load_plan("quickstart", overrides), UI(quiet=True), device="cpu", callbacks=callbacks)


def _cli_train(*args):
    res = runner.invoke(app, ["train", "--recipe", "quickstart", *args, "--device", "cpu", "-q", "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _lrs(run_dir):
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["lr"]) for r in rows if "lr" in r]


@pytest.mark.parametrize("scheduler,optimizer", [
    ("linear", "adamw"), ("cosine", "sgd"), ("constant", "adafactor"),
    ("constant_with_warmup", "adamw_fused"), ("polynomial", "adamw"),
])
def test_schedule_and_optimizer_through_the_cli_and_exact_resume(tiny_recipe, tmp_path, scheduler, optimizer):
    """The logged lr is transformers' schedule at each step (warm-up in steps), and a run cut at
    step 3 resumes to the same weights and log as the uninterrupted one with every scheduler."""
    from transformers import get_scheduler

    common = ("train.max_steps=8", "train.save_every=1", "train.log_every=1", "train.batch_size=4",
              f"train.lr_scheduler={scheduler}", f"train.optimizer={optimizer}", "train.warmup_steps=2")
    _cli_train(*tiny_recipe(*common, f"output.dir={tmp_path / 'ref'}"))
    ref_dir = tmp_path / "ref" / "tiny"
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    sched = get_scheduler(scheduler, opt, num_warmup_steps=2, num_training_steps=8)
    want = []
    for _ in range(8):
        opt.step()
        sched.step()
        want.append(sched.get_last_lr()[0])
    got = _lrs(ref_dir)
    assert [s for s, _ in got] == list(range(1, 9))
    assert [lr for _, lr in got] == pytest.approx(want)

    run = tiny_recipe(*common, f"output.dir={tmp_path / 'cut'}")
    with pytest.raises(KeyboardInterrupt):
        _train(run, callbacks=[_StopAt(3, KeyboardInterrupt())])
    resumed = _train(run)
    assert resumed.resumed_from is not None
    _assert_same_weights(ref_dir / "final", resumed.run_dir / "final")
    assert _lrs(resumed.run_dir) == _lrs(ref_dir)


def test_defaults_are_fused_adamw_with_linear_warmup_ratio():
    """Unchanged defaults: fused AdamW on the CPU and transformers' linear schedule with
    ``warmup_ratio`` (6 % of 100 steps = 6 warm-up steps)."""
    from finetune_cli.engine.setup import build_optimizer, build_scheduler
    from finetune_cli.recipe import TrainConfig

    cfg = TrainConfig()
    opt = build_optimizer(torch.nn.Linear(2, 2), cfg, torch.device("cpu"))
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["fused"] is True
    sched = build_scheduler(opt, cfg, 100)
    lrs = []
    for _ in range(7):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([cfg.lr * s / 6 for s in range(7)])


def _encoder_grads(model, batch, checkpointing: bool):
    from finetune_cli.models.text_model import enable_gradient_checkpointing

    model = copy.deepcopy(model)
    model.train()
    if checkpointing:
        enable_gradient_checkpointing(model)
    saved = {"now": 0, "peak": 0}

    def pack(t):  # bytes autograd keeps for the backward pass, outside any checkpointed layer
        saved["now"] += t.numel() * t.element_size()
        saved["peak"] = max(saved["peak"], saved["now"])
        return t

    torch.manual_seed(0)  # same dropout masks in both runs (the recomputation replays the RNG)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(batch)
    out.logits.logsumexp(-1).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, saved["peak"]


def test_gradient_checkpointing_same_gradients_less_activation_memory(tiny_model_dir):
    """Same gradients within 1e-5 (dropout on), and autograd keeps less than half the activations."""
    from finetune_cli.models.loading import build_text_model
    from finetune_cli.models.text_model import HeadSpec

    torch.manual_seed(0)
    model, tok = build_text_model(str(tiny_model_dir), lambda d: HeadSpec(num_labels=3, pooling="mean"))
    batch = dict(tok(["a sentence long enough to matter " * 6] * 8, return_tensors="pt", truncation=True,
                     max_length=64))
    plain, mem_plain = _encoder_grads(model, batch, checkpointing=False)
    ckpt, mem_ckpt = _encoder_grads(model, batch, checkpointing=True)
    assert plain.keys() == ckpt.keys() and len(plain) > 20
    for k in plain:
        torch.testing.assert_close(ckpt[k], plain[k], atol=1e-5, rtol=1e-5, msg=k)
    assert mem_ckpt < 0.5 * mem_plain, (mem_ckpt, mem_plain)


def test_gradient_checkpointing_trains_through_the_cli(tiny_recipe, tmp_path):
    out = _cli_train(*tiny_recipe("train.max_steps=2", "train.gradient_checkpointing=true"))
    assert out["steps"] == 2, out


# transformers' TrainingArguments names users type most, and the key they mean here.
TRAINER_NAMES = [
    ("learning_rate", "train.lr"), ("num_train_epochs", "train.epochs"), ("max_steps", "train.max_steps"),
    ("per_device_train_batch_size", "train.batch_size"), ("per_device_eval_batch_size", "train.eval_batch_size"),
    ("gradient_accumulation_steps", "train.grad_accum"), ("weight_decay", "train.weight_decay"),
    ("warmup_ratio", "train.warmup_ratio"), ("warmup_steps", "train.warmup_steps"),
    ("max_grad_norm", "train.max_grad_norm"), ("lr_scheduler_type", "train.lr_scheduler"),
    ("optim", "train.optimizer"), ("gradient_checkpointing", "train.gradient_checkpointing"),
    ("eval_steps", "train.eval_every"), ("save_steps", "train.save_every"), ("logging_steps", "train.log_every"),
    ("save_total_limit", "train.keep_checkpoints"), ("fp16", "train.precision=fp16"),
    ("bf16", "train.precision=bf16"), ("metric_for_best_model", "train.metric"), ("output_dir", "output.dir"),
    ("seed", "train.seed"),
]


@pytest.mark.parametrize("name,ours", TRAINER_NAMES)
@pytest.mark.parametrize("where", ["override", "yaml"])
def test_trainer_names_point_to_our_key(tmp_path, name, ours, where):
    """At the top level, under ``train.``, as an override or in the YAML file: one line, exit 2,
    naming our key."""
    for key in (name, f"train.{name}"):
        if key == ours:
            continue
        if where == "override":
            args = ["recipes", "validate", "quickstart", f"{key}=1"]
        else:
            f = tmp_path / "r.yaml"
            tree = {"train": {name: 1}} if key.startswith("train.") else {name: 1}
            f.write_text(json.dumps(tree))
            args = ["recipes", "validate", str(f)]
        res = runner.invoke(app, args)
        assert res.exit_code == 2, res.output
        assert f"did you mean `{ours}`?" in res.output, res.output
        assert len(res.output.strip().splitlines()) == 1
