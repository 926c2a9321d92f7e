"""Batched inference: original order restored, one host transfer per output, inference mode; the
one precision rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from finetune_cli.data.encode import EncodedData
from finetune_cli.engine.device import autocast_dtype, resolve_precision
from finetune_cli.engine.inference import forward_all
from finetune_cli.errors import DeviceError, TrainingError
from finetune_cli.models.loading import load_text_model
from finetune_cli.models.text_model import HeadSpec


@pytest.fixture
def model_and_data(tiny_model_dir):
    model, tok, _ = load_text_model(str(tiny_model_dir), HeadSpec(pooling="mean", num_labels=3))
    rng = np.random.default_rng(0)
    rows = [[101, *rng.integers(1000, 2000, rng.integers(0, 20)).tolist(), 102] for _ in range(37)]
    data = EncodedData([{"input_ids": rows}], None, np.array([len(r) for r in rows]))
    return model, data, rows


def test_forward_all_matches_one_by_one_in_input_order(model_and_data):
    model, data, rows = model_and_data
    model.train()
    out = forward_all(model, data, batch_size=8, pad_id=0, want=("logits", "embeddings"))
    assert model.training  # mode restored
    model.eval()
    with torch.no_grad():
        for i in (0, 5, 36):
            ids = torch.tensor([rows[i]])
            ref = model({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
            np.testing.assert_allclose(out["logits"][i], ref.logits[0].numpy(), atol=1e-5)
            np.testing.assert_allclose(out["embeddings"][i], ref.embeddings[0].numpy(), atol=1e-5)
    assert out["logits"].shape == (37, 3) and out["logits"].dtype == np.float32


def test_forward_all_transfers_once_per_output_and_runs_in_inference_mode(model_and_data, monkeypatch):
    model, data, _ = model_and_data
    real_cpu, calls, modes = torch.Tensor.cpu, {"n": 0}, []
    real_forward = type(model).forward

    def counting_cpu(self, *a, **k):
        calls["n"] += 1
        return real_cpu(self, *a, **k)

    def spy_forward(self, *a, **k):
        modes.append(torch.is_inference_mode_enabled())
        return real_forward(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "cpu", counting_cpu)
    monkeypatch.setattr(type(model), "forward", spy_forward)
    forward_all(model, data, batch_size=4, pad_id=0, want=("logits", "embeddings"))
    assert len(modes) == 10 and all(modes)  # 37 rows in batches of 4
    assert calls["n"] == 2  # one per output, not one per batch


# ---- the precision rule (every command: train, eval, predict, embed) ----------------------------

@pytest.mark.parametrize("spec,device,has_bf16,want", [
    ("auto", "cpu", True, "fp32"),   # the CPU is exact in fp32; bf16 only when asked
    ("auto", "cuda", True, "bf16"),
    ("auto", "cuda", False, "fp32"),
    ("fp32", "cuda", True, "fp32"),
    ("bf16", "cpu", False, "bf16"),  # allowed on the CPU (as train.precision=bf16 is), never picked by auto
    ("bf16", "cuda", True, "bf16"),
    ("fp16", "cuda", True, "fp16"),
])
def test_precision_rule(monkeypatch, spec, device, has_bf16, want):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: has_bf16)
    assert resolve_precision(spec, torch.device(device)) == want
    assert autocast_dtype(want) == {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[want]


@pytest.mark.parametrize("spec,words", [("fp16", "needs a GPU"), ("fp8", "expected auto, fp32, bf16 or fp16"),
                                        ("FP32", "expected")])
def test_precision_rule_refusals_name_the_option(spec, words):
    with pytest.raises(DeviceError, match=rf"^--precision .*{words}") as e:
        resolve_precision(spec, torch.device("cpu"))
    assert e.value.exit_code == 2 and "\n" not in str(e.value)


def test_training_takes_the_same_rule():
    from finetune_cli.engine.trainer import make_accelerator

    assert make_accelerator("cpu", "auto").mixed_precision == "no"
    with pytest.raises(TrainingError, match=r"^train\.precision fp16 needs a GPU") as e:
        make_accelerator("cpu", "fp16")
    assert e.value.exit_code == 3
