"""The SCL and Core-tuning recipes train the packaged MiniLM end to end and log their loss parts."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from finetune_cli.cli.main import app

pytestmark = pytest.mark.integration
runner = CliRunner()


@pytest.mark.parametrize("recipe,parts", [("scl", ("ce", "scl")), ("core_tuning", ("ce", "con"))])
def test_recipe_trains_embedded_model_and_logs_parts(tmp_path, recipe, parts):
    res = runner.invoke(app, ["train", "--recipe", f"recipes/{recipe}.yaml", "~data.dataset",
                              "data.train=pkg:quickstart/train.tsv", "data.eval=pkg:quickstart/dev.tsv",
                              "data.columns.text=sentence", "train.max_steps=10", "train.batch_size=16",
                              "train.log_every=5", f"output.dir={tmp_path}", "--device", "cpu", "--json", "-q"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["objective"] == recipe and s["steps"] == 10
    lines = [json.loads(x) for x in (tmp_path / recipe / "metrics.jsonl").read_text().splitlines()]
    logged = [x for x in lines if "loss" in x]
    assert [x["step"] for x in logged] == [5, 10]
    for x in logged:
        for p in parts:
            assert p in x and x[p] == x[p] and x[p] > 0  # present, not NaN, positive
    assert any("eval/accuracy" in x for x in lines)
    final = tmp_path / recipe / "final"
    # a native transformers classifier; only Core-tuning's projection head lives beside it
    assert json.loads((final / "config.json").read_text())["architectures"] == ["BertForSequenceClassification"]
    assert (final / "finetune_head.safetensors").is_file() == (recipe == "core_tuning")
