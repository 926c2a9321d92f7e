"""Folders ready for the Hub: the tokenizer says the trained length, cards are generated from the
run and parse as Hub metadata, pooled-head folders explain themselves, and ``finetune push``."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
import yaml
from typer.testing import CliRunner

from finetune_cli.cli.main import app
from tests.unit.test_use_elsewhere import TEXTS, _regression_files, _tool_logits

runner = CliRunner()
LONG = ["a gripping , funny film that " * 60, "dull and far too long , " * 70, TEXTS[2]]


def _train(*args):
    res = runner.invoke(app, ["train", "--recipe", "quickstart", *args, "--device", "cpu", "-q", "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_saved_tokenizer_truncates_at_the_trained_length(tiny_recipe, tmp_path):
    """A 128-position model trained at 64 tokens: ``pipeline(..., truncation=True)`` on inputs of
    hundreds of tokens runs and labels them as ``finetune predict`` does (it cut at 512 before)."""
    from transformers import AutoTokenizer, pipeline

    _train(*tiny_recipe("model.max_length=64", "train.max_steps=2"))
    final = tmp_path / "runs" / "tiny" / "final"
    assert AutoTokenizer.from_pretrained(str(final)).model_max_length == 64
    src = tmp_path / "long.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in LONG))
    res = runner.invoke(app, ["predict", str(final), "-i", str(src), "-o", str(tmp_path / "p.jsonl"), "--device", "cpu"])
    assert res.exit_code == 0, res.output
    want = [json.loads(x)["pred_label"] for x in (tmp_path / "p.jsonl").read_text().splitlines()]
    clf = pipeline("text-classification", model=str(final))
    got = [r["label"] for r in clf(LONG, truncation=True)]
    assert got == want


def _base_with_card(tiny_model_dir, tmp_path):
    base = tmp_path / "my-base"
    shutil.copytree(tiny_model_dir, base)
    (base / "README.md").write_text("---\nlicense: mit\nlanguage: en\n---\n# a base\n")
    return base


def test_regression_card_is_hub_metadata_generated_from_the_run(tmp_path, tiny_model_dir):
    """The card of an MSE model: parsed by ``huggingface_hub.ModelCard`` (model-index rebuilt into
    the evaluation results of ``eval_metrics.json``), license and language from the base card, no
    local path in the metadata, the real loss, the training log and the versions."""
    from huggingface_hub import ModelCard
    from huggingface_hub import __version__ as hub_version
    from huggingface_hub.repocard_data import model_index_to_eval_results

    train, dev = _regression_files(tmp_path)
    base = _base_with_card(tiny_model_dir, tmp_path)
    _train(f"model.name={base}", "model.max_length=32", "model.problem_type=regression", f"data.train={train}",
           f"data.eval={dev}", "data.columns.text=s1", "data.columns.text_pair=s2", "data.columns.label=score",
           "train.batch_size=8", "train.max_steps=4", "train.eval_every=2", "train.log_every=1", "train.metric=pearson",
           f"output.dir={tmp_path / 'runs'}", "output.name=reg")
    best = tmp_path / "runs" / "reg" / "best"
    text = (best / "README.md").read_text()
    card = ModelCard(text)  # raises on metadata the Hub would reject (a malformed model-index)
    d = card.data
    assert d.license == "mit" and d.language == "en" and d.base_model is None
    assert d.library_name == "transformers" and d.pipeline_tag == "text-classification"
    front = yaml.safe_load(text.split("---")[1])
    assert str(tmp_path) not in yaml.safe_dump(front)  # no local path in the metadata
    assert "a local model folder named `my-base`" in text
    name, results = model_index_to_eval_results(front["model-index"])
    scores = json.loads((best / "eval_metrics.json").read_text())
    assert name == "reg-best" and {r.metric_name: r.metric_value for r in results} == pytest.approx(
        {k: scores[k] for k in ("pearson", "spearman")})
    assert {r.metric_type for r in results} == {"pearsonr", "spearmanr"}  # the Hub's metric ids
    assert "Mean squared error" in text and "cross-entropy" not in text.lower() and "smoothing" not in text
    assert "### Training log" in text and re.search(r"\| 2 \| \S+ \| [0-9.]+ \| ", text)
    assert f"- huggingface-hub: {hub_version}" in text and "- transformers: " in text
    assert "| `optimizer` | adamw_fused |" in text and "| `lr_scheduler` | linear |" in text


def test_card_of_a_hub_base_names_it_and_the_paper(tmp_path):
    from finetune_cli.models.card import hub_base_model
    from finetune_cli.objectives import registry

    assert hub_base_model("embedded") == "sentence-transformers/all-MiniLM-L6-v2"
    assert hub_base_model("FacebookAI/roberta-base") == "FacebookAI/roberta-base"
    assert hub_base_model(str(tmp_path)) is None and hub_base_model("./x") is None
    for name in ("ce", "scl", "core_tuning", "r3f", "r4f", "focal", "dice", "simcse_unsup", "simcse_sup"):
        d = registry.get(name).describe("single_label_classification")
        assert d["loss"] and d["paper"].endswith(f"(arXiv {d['arxiv']})"), name
    assert "squared error" in registry.get("ce").describe("regression")["loss"]


def _exec_card_snippet(folder, text=None):
    """Run the card's first snippet with the card's name (a repo id once pushed) pointing at ``folder``."""
    from finetune_cli.models.card import rename_card

    code = re.findall(r"```python\n(.*?)```", rename_card(text or (folder / "README.md").read_text(), str(folder)),
                      re.S)[0]
    scope: dict = {}
    exec(compile(code, "card", "exec"), scope)  # noqa: S102 - the card's own documented snippet
    return scope["logits"]


@pytest.mark.parametrize("normalize", [False, True])
def test_pooled_folder_refuses_every_transformers_class_with_its_reason(tiny_recipe, tmp_path, normalize):
    """Auto classes, the architecture's own class and ``pipeline`` all stop on the reason; the
    card's sentence-transformers snippet gives finetune's logits; finetune still loads it."""
    from transformers import (
        AutoModel,
        AutoModelForSequenceClassification,
        BertForSequenceClassification,
        pipeline,
    )

    _train(*tiny_recipe("model.head=pooled", f"model.head_normalize={str(normalize).lower()}", "train.max_steps=2",
                        "train.eval_every=2"))
    best = tmp_path / "runs" / "tiny" / "best"
    for load in (BertForSequenceClassification.from_pretrained, AutoModelForSequenceClassification.from_pretrained,
                 AutoModel.from_pretrained, lambda p: pipeline("text-classification", model=p)):
        with pytest.raises(ValueError, match="finetune-pooled-classifier: no transformers class computes"):
            load(str(best))
    text = (best / "README.md").read_text()
    assert "### Why transformers refuses this folder" in text and "sentence-transformers" in text
    logits = _exec_card_snippet(best).cpu()
    assert torch.allclose(logits, _tool_logits(best, ["A sentence."]), atol=1e-5)


def test_pooled_folder_of_the_previous_layout_still_loads(tiny_recipe, tmp_path):
    """Folders written by 0.2.0 hid the model type instead: finetune loads them the same."""
    _train(*tiny_recipe("model.head=pooled", "train.max_steps=2"))
    final = tmp_path / "runs" / "tiny" / "final"
    want = _tool_logits(final, TEXTS)
    cfg = json.loads((final / "config.json").read_text())
    cfg.pop("transformers_weights")
    cfg["finetune_base_model_type"], cfg["model_type"] = cfg["model_type"], "finetune-pooled-classifier"
    (final / "config.json").write_text(json.dumps(cfg))
    assert torch.allclose(_tool_logits(final, TEXTS), want, atol=1e-6)


def test_push_checks_offline_and_lists_the_folder(tiny_recipe, tmp_path, monkeypatch):
    _train(*tiny_recipe("train.max_steps=2", "train.eval_every=2"))
    run = tmp_path / "runs" / "tiny"
    res = runner.invoke(app, ["push", str(run), "me/tiny", "--dry-run", "--json", "--private", "--revision", "v1"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["folder"] == str(run / "best") and out["private"] and out["revision"] == "v1"
    assert {"README.md", "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(
        out["files"])
    for bad in ("me/ti ny", "tiny", "a/b/c", "me/-x"):
        res = runner.invoke(app, ["push", str(run), bad, "--dry-run"])
        assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, (bad, res.output)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # huggingface_hub reads it per call
    res = runner.invoke(app, ["push", str(run), "me/tiny"])
    assert res.exit_code == 5 and res.output.startswith("error: cannot push to me/tiny"), res.output
    assert len(res.output.strip().splitlines()) == 1
    card = run / "best" / "README.md"  # a card naming a local base model (finetune 0.2.0): refused
    card.write_text(card.read_text().replace("---\n", f"---\nbase_model: {tmp_path}\n", 1))
    res = runner.invoke(app, ["push", str(run), "me/tiny", "--dry-run"])
    assert res.exit_code == 2 and "local path" in res.output, res.output
