"""The README's main job on the packaged MiniLM, and real learning on SST-2 when shared data exists."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from finetune_cli.cli.main import app
from tests.conftest import shared_data_or_skip

pytestmark = pytest.mark.integration
runner = CliRunner()


def test_quickstart_recipe_trains_the_embedded_model(tmp_path):
    res = runner.invoke(app, ["train", "--recipe", "recipes/quickstart.yaml", f"output.dir={tmp_path}", "--json",
                              "-q", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["steps"] == 57 and s["train_examples"] == 300
    # held-out subjects in dev: the model must generalise beyond memorised phrases
    assert s["best_metric"] >= 0.9
    res = runner.invoke(app, ["eval", str(tmp_path / "quickstart"), "--json", "-q"])
    assert res.exit_code == 0 and json.loads(res.stdout)["metrics"]["accuracy"] == pytest.approx(s["best_metric"])


@pytest.mark.slow
def test_sst2_1000_sentences_reaches_measured_floor(tmp_path):
    data = shared_data_or_skip()
    shared_data_or_skip("SST-2", "train.tsv")
    res = runner.invoke(app, ["train", "-r", "ce", "--data-dir", str(data), "data.max_train_samples=1000",
                              "train.epochs=3", "train.eval_every=1000", f"output.dir={tmp_path}", "--json", "-q",
                              "--device", "cpu"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["eval_examples"] == 872
    # Measured 0.79 (seed 42), see the issue-3 note; the floor leaves room for seed/platform noise
    # but sits far above chance (0.51) and above the untrained head.
    assert s["final_eval"]["accuracy"] >= 0.75


@pytest.mark.slow
def test_lora_recipe_learns_with_a_small_share_of_the_parameters(tmp_path):
    """The LoRA recipe on the packaged MiniLM: >= 0.9 accuracy on the held-out reviews after 40 of its
    57 steps (measured 0.98 there, 1.00 at 57), with < 5% of the parameters trained; the adapter
    folder predicts, and its merge gives the same probabilities (~2 min on 2 idle cores)."""
    res = runner.invoke(app, ["train", "-r", "lora", "train.max_steps=40", f"output.dir={tmp_path}", "--json", "-q",
                              "--device", "cpu"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["best_metric"] >= 0.9
    assert s["trainable_params"] < 0.05 * 22_713_216  # all-MiniLM-L6-v2 has 22.7M parameters
    run = tmp_path / "lora"
    assert (run / "best" / "adapter_config.json").is_file()
    assert runner.invoke(app, ["export", str(run), "--merge", "-o", str(tmp_path / "merged"), "-q"]).exit_code == 0
    probs = {}
    (tmp_path / "in.tsv").write_text("text\nThe kettle is quiet and boils fast.\nBroke after a week. Avoid it.\n")
    for name in ("lora", "merged"):
        out = tmp_path / f"{name}.jsonl"
        assert runner.invoke(app, ["predict", str(tmp_path / name), "-i", str(tmp_path / "in.tsv"), "-o", str(out),
                                   "-q"]).exit_code == 0
        probs[name] = [json.loads(x)["prob_positive"] for x in out.read_text().splitlines()]
    assert probs["lora"] == pytest.approx(probs["merged"], abs=1e-5)
