"""Batched inference: original order restored, one host transfer per output, inference mode; the
one precision rule; the inference session that eval, predict and embed share."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from finetune_cli.data.encode import EncodedData
from finetune_cli.engine.device import autocast_dtype, resolve_precision
from finetune_cli.engine.inference import forward_all, open_session, pad_id
from finetune_cli.errors import DeviceError, RecipeError, TrainingError
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
    from finetune_cli.engine.setup import make_accelerator

    assert make_accelerator(torch.device("cpu"), "auto").mixed_precision == "no"
    with pytest.raises(TrainingError, match=r"^train\.precision fp16 needs a GPU") as e:
        make_accelerator(torch.device("cpu"), "fp16")
    assert e.value.exit_code == 3


# ---- the session --------------------------------------------------------------------------------

def test_pad_id_is_the_tokenizers_else_zero():
    assert pad_id(SimpleNamespace(pad_token_id=1)) == 1
    assert pad_id(SimpleNamespace(pad_token_id=None)) == 0


def test_pad_id_is_computed_in_one_place():
    pkg = Path(__file__).resolve().parents[2] / "finetune_cli"
    hits = [f"{p.relative_to(pkg)}:{i}" for p in sorted(pkg.rglob("*.py"))
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if "pad_token_id if" in line]
    assert len(hits) == 1 and hits[0].startswith("engine/inference.py:"), hits


def test_session_on_cpu_is_fp32_and_forwards_as_forward_all(tiny_model_dir, model_and_data):
    _, data, _ = model_and_data
    sess = open_session(str(tiny_model_dir), device="cpu")
    assert (sess.device.type, sess.precision, sess.pad_id, sess.path) == ("cpu", "fp32", 0, str(tiny_model_dir))
    assert sess.max_length == 128  # the tokenizer says 512; the model has 128 positions
    assert not sess.model.training
    got = sess.forward(data, 8, want=("embeddings",))["embeddings"]
    ref = forward_all(sess.model, data, 8, 0, want=("embeddings",))["embeddings"]
    np.testing.assert_array_equal(got, ref)
    enc = sess.encode_texts(["a short one", "word " * 300])
    assert enc.lengths.tolist() == [5, 128]  # cut at the session's length


def test_session_refuses_a_length_over_the_models_positions(tiny_model_dir):
    with pytest.raises(RecipeError, match=r"^model\.max_length 4096 .*position limit"):
        open_session(str(tiny_model_dir), device="cpu", max_length=4096, length_key="model.max_length")


def test_session_bf16_on_cpu_runs_under_autocast(tiny_model_dir, model_and_data, monkeypatch):
    _, data, _ = model_and_data
    fp32 = open_session(str(tiny_model_dir), device="cpu").forward(data, 8, want=("embeddings",))["embeddings"]
    sess = open_session(str(tiny_model_dir), device="cpu", precision="bf16")
    seen = []
    real = type(sess.model).forward
    monkeypatch.setattr(type(sess.model), "forward",
                        lambda self, *a, **k: seen.append(torch.get_autocast_dtype("cpu")
                                                          if torch.is_autocast_enabled("cpu") else None)
                        or real(self, *a, **k))
    bf16 = sess.forward(data, 8, want=("embeddings",))["embeddings"]
    assert sess.precision == "bf16" and set(seen) == {torch.bfloat16}
    assert bf16.dtype == np.float32 and np.allclose(bf16, fp32, atol=0.1) and not np.array_equal(bf16, fp32)


# ---- through the CLI: --precision reaches every inference command -------------------------------

def _cli(*args):
    from typer.testing import CliRunner

    from finetune_cli.cli.main import app

    res = CliRunner().invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_eval_predict_embed_accept_precision_and_fp32_is_the_cpu_default(tiny_recipe, quickstart_data, tmp_path):
    _cli("train", "-r", "quickstart", *tiny_recipe("train.max_steps=2", "train.eval_every=2"), "--device", "cpu",
         "--json", "-q")
    run = str(tmp_path / "runs" / "tiny")
    cpu = ("--device", "cpu", "--json", "-q")
    evals = [_cli("eval", run, "--no-figures", "--out", str(tmp_path / f"ev{i}"), *cpu, *flags)
             for i, flags in enumerate([(), ("--precision", "fp32")])]
    assert [e.pop("precision") for e in evals] == ["fp32", "fp32"]
    assert [{k: v for k, v in e.items() if k != "saved_to"} for e in evals][0] == \
           [{k: v for k, v in e.items() if k != "saved_to"} for e in evals][1]
    preds = [_cli("predict", run, "-i", quickstart_data["eval"], "-c", "sentence", "-o", str(tmp_path / f"p{i}.csv"),
                  *cpu, *flags) for i, flags in enumerate([(), ("--precision", "fp32")])]
    assert [p["precision"] for p in preds] == ["fp32", "fp32"]
    assert (tmp_path / "p0.csv").read_bytes() == (tmp_path / "p1.csv").read_bytes()
    txt = tmp_path / "s.txt"
    txt.write_text("a cat sat\nthe dog ran far away from home\nsun\n")
    embeds = [_cli("embed", run, str(txt), "-o", str(tmp_path / f"e{i}.npy"), *cpu, *flags)
              for i, flags in enumerate([(), ("--precision", "fp32"), ("--precision", "bf16")])]
    assert [e["precision"] for e in embeds] == ["fp32", "fp32", "bf16"]
    e0, e1, e2 = (np.load(tmp_path / f"e{i}.npy") for i in range(3))
    np.testing.assert_array_equal(e0, e1)
    assert np.allclose(e0, e2, atol=0.1) and not np.array_equal(e0, e2)  # bf16 reached the model


# ---- the graph path of inference (--cuda-graphs) ------------------------------------------------

def test_bucketed_forward_pads_rows_and_widths_without_changing_any_output(model_and_data):
    """The batches of the graph path (``capture=False``: the same padded batches, run eagerly): every
    batch is `batch_size` rows (the last row repeated) by a multiple of 32 tokens, and every output
    equals the plain path's (fp32, 1e-6)."""
    from finetune_cli.engine.inference import GraphedForward

    model, data, rows = model_and_data
    model.eval()
    shapes = []
    model.register_forward_pre_hook(lambda m, args: shapes.append(tuple(args[0]["input_ids"].shape)))
    ref = forward_all(model, data, 8, 0, want=("logits", "embeddings"))
    plain = list(shapes)
    shapes.clear()
    graphs = GraphedForward(model, torch.device("cpu"), rows=8, max_width=40, capture=False)
    got = forward_all(model, data, 8, 0, want=("logits", "embeddings"), graphs=graphs)
    for k in ("logits", "embeddings"):
        np.testing.assert_allclose(got[k], ref[k], rtol=0, atol=1e-6)
    assert len(shapes) == len(plain) == 5  # 37 rows in batches of 8
    assert {s[0] for s in shapes} == {8} and {s[1] for s in shapes} <= {32, 40}  # 32 or the cap
    assert len({s[1] for s in plain}) > len({s[1] for s in shapes})  # fewer shapes: fewer graphs


def test_cuda_graphs_option_on_a_cpu(tiny_model_dir, tmp_path):
    """`on` is refused in one line where graphs cannot run; `auto` runs eagerly there, as `off`."""
    from tests.unit._cli import invoke, one_error_line

    with pytest.raises(DeviceError, match=r"^--cuda-graphs on: the model runs on cpu, not on a CUDA GPU; use "):
        open_session(str(tiny_model_dir), device="cpu", cuda_graphs="on")
    with pytest.raises(DeviceError, match=r"^--cuda-graphs sometimes: choose off, auto or on"):
        open_session(str(tiny_model_dir), device="cpu", cuda_graphs="sometimes")
    assert not open_session(str(tiny_model_dir), device="cpu", cuda_graphs="auto").use_graphs
    src = tmp_path / "in.txt"
    src.write_text("a fine day\nrain again\n")
    outs = {}
    for mode in ("off", "auto"):
        res = invoke("embed", str(tiny_model_dir), str(src), "--output", str(tmp_path / f"{mode}.npy"),
                     "--cuda-graphs", mode, "--device", "cpu", "-q")
        assert res.exit_code == 0, res.output
        outs[mode] = np.load(tmp_path / f"{mode}.npy")
    np.testing.assert_array_equal(outs["off"], outs["auto"])
    res = invoke("embed", str(tiny_model_dir), str(src), "--output", str(tmp_path / "on.npy"), "--cuda-graphs", "on",
                 "--device", "cpu", "-q")
    assert res.exit_code == 2 and one_error_line(res).endswith("use --cuda-graphs auto or off")
    assert not (tmp_path / "on.npy").exists()
