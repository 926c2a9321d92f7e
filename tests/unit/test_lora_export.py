"""LoRA adapters (``model.lora``) and ``finetune export`` (``--merge``, ``--format onnx``), on the
tiny random BERT: the saved folder is a peft adapter folder peft itself loads to the same logits,
a merge keeps them, a resumed LoRA run ends where an uninterrupted one does, and an ONNX folder
computes the tool's logits / embeddings in onnxruntime and is accepted by ``predict`` / ``embed``."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from finetune_cli.cli.main import app
from finetune_cli.engine.inference import open_session
from finetune_cli.models.loading import load_text_model
from finetune_cli.pipelines.export import run_export
from finetune_cli.pipelines.recipes import load_plan
from finetune_cli.pipelines.train import run_train
from finetune_cli.ui import UI

SENTENCES = ["The kettle is quiet and boils fast.", "Broke after a week, avoid.", "fine", "not bad at all, really"]
LORA = ("model.lora.r=4", "model.lora.alpha=8", "train.lr=1e-2", "train.head_lr=1e-2")


def _train(overrides, callbacks=()):
    return run_train(load_plan(None, overrides), UI(quiet=True), device="cpu", callbacks=callbacks)


def _features(tok, texts=SENTENCES):
    return dict(tok(texts, padding=True, return_tensors="pt"))


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, tiny_model_dir):
    from tests.conftest import QUICKSTART

    out = tmp_path_factory.mktemp("lora")
    res = _train([f"model.name={tiny_model_dir}", "model.max_length=32", f"data.train={QUICKSTART / 'train.tsv'}",
                  f"data.eval={QUICKSTART / 'dev.tsv'}", "data.columns.text=sentence", "data.max_train_samples=64",
                  "train.batch_size=8", "train.epochs=1", f"output.dir={out}", "output.name=lora", *LORA])
    return res


def test_a_lora_run_saves_a_peft_adapter_folder_peft_loads_to_the_same_logits(lora_run, tiny_model_dir):
    from peft import AutoPeftModelForSequenceClassification
    from transformers import AutoModelForSequenceClassification

    final = lora_run.run_dir / "final"
    assert (final / "adapter_config.json").is_file() and not (final / "model.safetensors").exists()
    cfg = json.loads((final / "adapter_config.json").read_text())
    assert cfg["base_model_name_or_path"] == str(tiny_model_dir.resolve()) and cfg["r"] == 4
    assert cfg["modules_to_save"] == ["bert.pooler", "classifier"]  # the native head: trained in full
    saved = load_file(str(final / "adapter_model.safetensors"))
    lora_b = [v for k, v in saved.items() if "lora_B" in k]
    assert lora_b and all(v.abs().sum() > 0 for v in lora_b)  # the adapters trained (they start at zero)
    # what the optimizer updated is what the folder holds; a small share of the model
    assert lora_run.summary["trainable_params"] == sum(v.numel() for v in saved.values())
    ours, tok, _ = load_text_model(str(final))
    total = sum(p.numel() for p in ours.parameters())
    assert lora_run.summary["trainable_params"] < 0.05 * total
    from huggingface_hub import ModelCard

    card = ModelCard.load(final / "README.md")  # the card says what the folder is
    assert card.data.library_name == "peft" and {"peft", "lora"} <= set(card.data.tags)
    assert "LoRA adapter" in card.text and "--merge" in card.text

    feats = _features(tok)
    peft_model = AutoPeftModelForSequenceClassification.from_pretrained(str(final)).eval()
    with torch.no_grad():
        want = peft_model(**feats).logits
        got = ours.eval()(feats).logits
        merged = open_session(str(final), device="cpu").model(feats).logits  # predict/eval: adapters folded in
        base = AutoModelForSequenceClassification.from_pretrained(str(tiny_model_dir), num_labels=2)
    assert torch.allclose(got, want, atol=1e-6) and torch.allclose(merged, want, atol=1e-5)
    assert not torch.allclose(ours.encoder(**feats).last_hidden_state, base.bert(**feats).last_hidden_state,
                              atol=1e-4)  # the adapters change the encoder


def test_merge_exports_a_plain_folder_with_the_adapters_logits(lora_run, tmp_path):
    from peft import AutoPeftModelForSequenceClassification
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    res = run_export(str(lora_run.run_dir), str(tmp_path / "merged"), UI(quiet=True), merge=True)
    assert res.merged and not (tmp_path / "merged" / "adapter_config.json").exists()
    tok = AutoTokenizer.from_pretrained(tmp_path / "merged")
    plain = AutoModelForSequenceClassification.from_pretrained(tmp_path / "merged").eval()
    adapter = AutoPeftModelForSequenceClassification.from_pretrained(res.model).eval()
    with torch.no_grad():
        a, b = adapter(**_features(tok)).logits, plain(**_features(tok)).logits
    assert (a - b).abs().max() < 1e-5
    assert plain.config.id2label == {0: "negative", 1: "positive"}


def test_merge_of_a_plain_folder_and_a_transformers_export_without_merge_are_refused(tiny_model_dir, tmp_path):
    r = CliRunner().invoke(app, ["export", str(tiny_model_dir), "-o", str(tmp_path / "m"), "--merge"])
    assert r.exit_code == 2 and "not a LoRA adapter folder" in r.output and r.output.count("\n") == 1
    r = CliRunner().invoke(app, ["export", str(tiny_model_dir), "-o", str(tmp_path / "m")])
    assert r.exit_code == 2 and "pass --merge" in r.output


@pytest.mark.parametrize("extra", [("objective.name=r4f",), ("model.head=pooled",)])
def test_lora_with_other_heads_reloads_to_its_own_logits(tiny_recipe, extra):
    """R4F's spectrally-normalised head (folded in the adapter file) and the pooled head (in
    finetune_head.safetensors) reload to the trained function, merged or not."""
    out = _train(tiny_recipe(*LORA, *extra))
    final = out.run_dir / "final"
    model, tok, _ = load_text_model(str(final))
    feats = _features(tok)
    with torch.no_grad():
        got = model.eval()(feats).logits
        merged = open_session(str(final), device="cpu").model(feats).logits
    assert torch.allclose(got, merged, atol=1e-5)
    if extra == ("objective.name=r4f",):
        from peft import AutoPeftModelForSequenceClassification

        with torch.no_grad():
            want = AutoPeftModelForSequenceClassification.from_pretrained(str(final)).eval()(**feats).logits
        assert torch.allclose(got, want, atol=1e-5)


EMBEDDING = ("objective.name=simcse_unsup", "~data.eval", "data.columns.label=null")


@pytest.mark.parametrize("kind", [(), EMBEDDING], ids=["classifier", "embedding"])
def test_an_interrupted_lora_run_resumes_to_the_same_adapters(tiny_recipe, tmp_path, kind):
    """An embedding adapter's checkpoints hold adapter_config.json and no config.json: still a checkpoint."""
    common = (*LORA, *kind, "train.epochs=2", "train.eval_every=3", "train.save_every=1", "train.batch_size=4")
    ref = _train(tiny_recipe(*common, f"output.dir={tmp_path / 'ref'}"))
    run = tiny_recipe(*common, f"output.dir={tmp_path / 'cut'}")

    def stop(trainer, state):
        if state.step == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _train(run, callbacks=[stop])
    resumed = _train(run)
    assert resumed.resumed_from is not None and resumed.resumed_from.name == "checkpoint-5"
    a = load_file(str(ref.run_dir / "final" / "adapter_model.safetensors"))
    b = load_file(str(resumed.run_dir / "final" / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_an_embedding_objective_saves_a_sentence_transformers_adapter_folder(tiny_recipe, tmp_path):
    from sentence_transformers import SentenceTransformer

    out = _train(tiny_recipe(*LORA, *EMBEDDING))
    final = out.run_dir / "final"
    assert (final / "adapter_config.json").is_file() and (final / "modules.json").is_file()
    sess = open_session(str(final), device="cpu", embedding=True)
    ours = sess.forward(sess.encode_texts(SENTENCES), 8, want=("embeddings",))["embeddings"]
    st = SentenceTransformer(str(final), device="cpu").encode(SENTENCES, convert_to_numpy=True)
    assert np.abs(ours - st).max() < 1e-5
    from finetune_cli.errors import ModelError
    from finetune_cli.pipelines.push import run_push

    with pytest.raises(ModelError, match="base model is the local path"):  # nobody else could load its base
        run_push(str(out.run_dir), "someone/simcse-lora", dry_run=True)
    cfg = json.loads((final / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = "someone/tiny-bert"  # over a hub base, the folder (no config.json) goes up
    (final / "adapter_config.json").write_text(json.dumps(cfg))
    assert "adapter_model.safetensors" in run_push(str(out.run_dir), "someone/simcse-lora", dry_run=True).files


def test_lora_refusals_are_one_line(tiny_recipe, lora_run, monkeypatch):
    import importlib.util

    from finetune_cli.errors import ModelError, RecipeError

    with pytest.raises(RecipeError, match="exclusive"):
        load_plan(None, tiny_recipe(*LORA, "model.reinit_layers=1"))
    with pytest.raises(ModelError, match="is a LoRA adapter folder"):
        _train(tiny_recipe(*LORA, f"model.name={lora_run.run_dir / 'final'}", "output.name=again"))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "peft" else real(n, *a))
    with pytest.raises(RecipeError, match=r"pip install 'finetune-cli\[lora\]'"):
        load_plan(None, tiny_recipe(*LORA))


# ---- ONNX ---------------------------------------------------------------------------------------

def _hundred() -> list[str]:
    from tests.conftest import QUICKSTART

    rows = (QUICKSTART / "train.tsv").read_text().splitlines()[1:]
    return [r.split("\t")[0] for r in rows[:100]]


def _ort_outputs(folder, texts, want):
    import onnxruntime as ort
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    sess = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    outs = []
    for i in range(0, len(texts), 32):  # batches of other sizes and widths than the traced one
        enc = tok(texts[i:i + 32], padding=True, truncation=True, max_length=64, return_tensors="np")
        feed = {x.name: enc[x.name].astype(np.int64) for x in sess.get_inputs()}
        outs.append(sess.run(None, feed)[names.index(want)])
    return np.concatenate(outs)


@pytest.mark.parametrize("kind", ["classifier", "embedding"])
def test_onnx_export_computes_the_tools_outputs_on_100_sentences(lora_run, tiny_model_dir, tmp_path, kind):
    src = lora_run.run_dir if kind == "classifier" else tiny_model_dir
    want = "logits" if kind == "classifier" else "embeddings"
    res = run_export(str(src), str(tmp_path / "onnx"), UI(quiet=True), fmt="onnx")
    assert want in res.outputs and (tmp_path / "onnx" / "model.onnx").is_file()
    texts = _hundred()
    sess = open_session(str(src), device="cpu", embedding=True, max_length=64)
    ref = sess.forward(sess.encode_texts(texts), 16, want=(want,))[want]
    got = _ort_outputs(tmp_path / "onnx", texts, want)
    assert got.shape == ref.shape and np.abs(got - ref).max() < 1e-4
    onnx_sess = open_session(str(tmp_path / "onnx"), device="cpu", embedding=True, max_length=64)
    assert type(onnx_sess.model).__name__ == "OnnxTextModel"
    via = onnx_sess.forward(onnx_sess.encode_texts(texts), 16, want=(want,))[want]
    assert np.abs(via - ref).max() < 1e-4


def test_predict_accepts_an_onnx_folder(lora_run, tmp_path):
    run_export(str(lora_run.run_dir), str(tmp_path / "onnx"), UI(quiet=True), fmt="onnx")
    (tmp_path / "in.tsv").write_text("text\n" + "".join(t + "\n" for t in SENTENCES))
    rows = {}
    for name, model in (("torch", lora_run.run_dir), ("onnx", tmp_path / "onnx")):
        r = CliRunner().invoke(app, ["predict", str(model), "-i", str(tmp_path / "in.tsv"),
                                     "-o", str(tmp_path / f"{name}.jsonl"), "-q"])
        assert r.exit_code == 0, r.output
        rows[name] = [json.loads(x) for x in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
    for a, b in zip(rows["torch"], rows["onnx"], strict=True):
        assert a["pred_label"] == b["pred_label"] and abs(a["prob_positive"] - b["prob_positive"]) < 1e-4


def test_onnx_without_onnxruntime_is_one_line_naming_the_extra(lora_run, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    r = CliRunner().invoke(app, ["export", str(lora_run.run_dir), "-o", str(tmp_path / "o"), "--format", "onnx"])
    assert r.exit_code == 2 and "pip install 'finetune-cli[onnx]'" in r.output and r.output.count("\n") == 1


def test_onnx_export_of_a_pooled_head_classifier_keeps_the_head(tiny_recipe, tmp_path):
    """A classifier with ``model.head=pooled`` (pooling + linear, finetune's own head) exports its
    logits too, and ``predict`` on the ONNX folder gives the torch folder's predictions (before, the
    head was dropped without a word and predict failed on a missing `logits`)."""
    res = _train(tiny_recipe("model.head=pooled", "train.max_steps=4"))
    out = run_export(str(res.run_dir), str(tmp_path / "onnx"), UI(quiet=True), fmt="onnx")
    assert out.outputs == ["logits", "embeddings"]
    (tmp_path / "in.tsv").write_text("text\n" + "".join(t + "\n" for t in _hundred()[:40]))
    rows = {}
    for name, model in (("torch", res.run_dir), ("onnx", tmp_path / "onnx")):
        r = CliRunner().invoke(app, ["predict", str(model), "-i", str(tmp_path / "in.tsv"),
                                     "-o", str(tmp_path / f"{name}.jsonl"), "-q"])
        assert r.exit_code == 0, r.output
        rows[name] = [json.loads(x) for x in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
    assert len(rows["onnx"]) == 40
    for a, b in zip(rows["torch"], rows["onnx"], strict=True):
        assert a["pred_label"] == b["pred_label"] and abs(a["prob_positive"] - b["prob_positive"]) < 1e-4


def test_exporters_are_a_table():
    """A format is one entry of ``models/exporters.EXPORTERS``: the command, the card and loading read
    the table, and no module outside it names a format's files or branches on a format's name."""
    import re
    from pathlib import Path

    from finetune_cli.models.exporters import EXPORTERS, exported_as, exporter

    assert set(EXPORTERS) == {"transformers", "onnx"}
    pkg = Path(__file__).resolve().parents[2] / "finetune_cli"
    branching = re.compile(r"""(fmt|format)\s*==\s*["'](onnx|transformers)["']""")
    bad = [f"{p.relative_to(pkg)}:{i}" for p in sorted(pkg.rglob("*.py")) for i, ln in
           enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if branching.search(ln)]
    assert bad == []
    with pytest.raises(Exception, match="choose one of transformers, onnx"):
        exporter("tflite")
    assert exported_as(Path(__file__).parent) is None
