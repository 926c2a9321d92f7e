"""Few-shot training support: head-only mode (``train.freeze_encoder``), a budget in optimizer steps
(``train.min_steps``) and an evaluation cadence tied to it (``train.min_evals``)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from finetune_cli.engine.setup import eval_interval
from finetune_cli.pipelines.recipes import load_plan
from finetune_cli.pipelines.train import run_train
from finetune_cli.recipe import TrainConfig
from finetune_cli.ui import UI


def _train(overrides):
    return run_train(load_plan(None, overrides), UI(quiet=True), device="cpu")


def _encoder_changes(tiny_model_dir, model_dir) -> list[str]:
    """Names of the pre-trained tensors that differ between the tiny model and a trained model."""
    before = load_file(str(tiny_model_dir / "model.safetensors"))
    after = load_file(str(model_dir / "model.safetensors"))
    common = [k for k in before if any(a.endswith(k) or k.endswith(a) for a in after)]
    assert len(common) == len(before), "trained model does not hold the encoder's tensors"
    by_suffix = {k: next(a for a in after if a.endswith(k) or k.endswith(a)) for k in before}
    return [k for k in before if not torch.equal(before[k], after[by_suffix[k]])]


def _head(model_dir) -> dict[str, torch.Tensor]:
    """The classification head's tensors: inside the transformers folder for a native head
    (``classifier.*``), in ``finetune_head.safetensors`` for a pooled one."""
    extra = model_dir / "finetune_head.safetensors"
    if extra.is_file():
        return load_file(str(extra))
    return {k: v for k, v in load_file(str(model_dir / "model.safetensors")).items() if k.startswith("classifier")}


def _losses(run_dir, key="loss") -> list[float]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [x[key] for x in lines if key in x]


# SCL's contrastive part is a constant of the batch on frozen features and its CE part weighs 0.1,
# so its logged losses are batch noise: for it the test checks which weights moved, not the loss.
@pytest.mark.parametrize(("objective", "loss_key"), [("ce", "loss"), ("focal", "loss"), ("scl", None)])
def test_freeze_encoder_trains_only_the_head(tiny_recipe, tiny_model_dir, objective, loss_key):
    common = ("train.freeze_encoder=true", "train.head_lr=1e-2", "train.log_every=4", f"objective.name={objective}")
    short = _train(tiny_recipe(*common, "train.max_steps=1", "output.name=short"))
    out = _train(tiny_recipe(*common, "train.min_steps=40", "output.name=long"))
    assert out.summary["steps"] == 40
    assert _encoder_changes(tiny_model_dir, out.run_dir / "final") == []
    head_a, head_b = _head(short.run_dir / "final"), _head(out.run_dir / "final")
    assert head_a and any(not torch.equal(head_a[k], head_b[k]) for k in head_a), "the head did not train"
    if loss_key:
        losses = _losses(out.run_dir, loss_key)
        assert losses[-1] < losses[0]


def test_without_freeze_the_encoder_does_change(tiny_recipe, tiny_model_dir):
    """The control of the test above: the same check sees a fine-tuned encoder."""
    out = _train(tiny_recipe("train.max_steps=4"))
    assert _encoder_changes(tiny_model_dir, out.run_dir / "final")


def test_min_steps_repeats_epochs_and_min_evals_gives_best(tiny_recipe):
    # 64 examples / batch 8 = 8 steps an epoch; eval_every=500 would evaluate only at the end.
    out = _train(tiny_recipe("train.min_steps=20", "train.eval_every=500", "train.min_evals=4",
                             "train.save_every=1000"))
    s = out.summary
    assert s["steps"] == s["total_steps"] == 20 and s["epochs_done"] >= 2
    lines = [json.loads(x) for x in (out.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "eval/accuracy" in x] == [5, 10, 15, 20]
    assert (out.run_dir / "best" / "config.json").is_file()


def test_min_steps_is_a_floor_not_a_cap(tiny_recipe):
    out = _train(tiny_recipe("train.epochs=2", "train.min_steps=3"))
    assert out.summary["steps"] == 16


def test_eval_interval():
    assert eval_interval(TrainConfig(), 8, 80) == 8  # once per epoch
    assert eval_interval(TrainConfig(eval_every=500), 8, 80) == 500
    assert eval_interval(TrainConfig(eval_every=500, min_evals=10), 8, 80) == 8
    assert eval_interval(TrainConfig(eval_every=5, min_evals=2), 8, 80) == 5  # already more often
    assert eval_interval(TrainConfig(min_evals=50), 8, 20) == 1
    # few-shot: 3 steps an epoch, 200 steps: 10 evaluations, not 67
    assert eval_interval(TrainConfig(min_evals=10), 3, 200) == 20


def test_max_steps_decides_alone(tiny_recipe):
    """``max_steps`` is the explicit budget (a quick ``train.max_steps=2`` on a few-shot recipe works)."""
    out = _train(tiny_recipe("train.min_steps=20", "train.max_steps=3"))
    assert out.summary["steps"] == out.summary["total_steps"] == 3


@pytest.mark.parametrize("head", ["native", "pooled"])
def test_freeze_encoder_freezes_exactly_the_encoder(tiny_model_dir, head):
    from finetune_cli.engine.setup import freeze_encoder, set_train_mode
    from finetune_cli.models.loading import load_text_model
    from finetune_cli.models.text_model import HeadSpec

    model, _, _ = load_text_model(str(tiny_model_dir), HeadSpec(num_labels=2, head=head))
    classifier = model.hf.classifier if head == "native" else model.classifier
    n = freeze_encoder(model)
    assert n == sum(p.numel() for p in model.encoder.parameters())
    assert all(p.requires_grad for p in classifier.parameters())
    set_train_mode(model, frozen_encoder=True)
    assert model.training and classifier.training and not model.encoder.training
    assert not any(m.training for m in model.encoder.modules())
    # under DDP the encoder is `module.encoder`
    wrapper = torch.nn.ModuleDict({"module": model})
    wrapper.train()
    set_train_mode(wrapper, frozen_encoder=True)
    assert classifier.training and not model.encoder.training
    bare, _, _ = load_text_model(str(tiny_model_dir), HeadSpec(num_labels=0))
    freeze_encoder(bare)  # a model without a head: the trainer refuses it ("nothing to train")
    assert not any(p.requires_grad for p in bare.parameters())
