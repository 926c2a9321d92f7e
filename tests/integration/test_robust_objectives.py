"""The r3f, r4f, focal and dice recipes train end to end on the packaged MiniLM and log their loss
parts separately in metrics.jsonl."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from finetune_cli.cli.main import app
from finetune_cli.objectives import get

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("name", ["r3f", "r4f", "focal", "dice"])
def test_recipe_trains_and_logs_its_parts(tmp_path, name):
    res = CliRunner().invoke(app, [
        "train", "--recipe", f"recipes/{name}.yaml", "~data.dataset", "data.train=pkg:quickstart/train.tsv",
        "data.eval=pkg:quickstart/dev.tsv", "data.columns.text=sentence", "train.max_steps=6",
        "train.batch_size=16", "train.log_every=2", "train.eval_every=6", f"output.dir={tmp_path}", "--json", "-q",
        "--device", "cpu"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["steps"] == 6
    rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "loss" in r]
    assert len(train_rows) == 3
    for part in get(name).parts:
        assert all(part in r and r[part] == r[part] for r in train_rows), (part, train_rows[0])
    if name in ("r3f", "r4f"):
        assert all(r["sym_kl"] >= 0 for r in train_rows)
        model_dir = next(d for d in (tmp_path / name / "best", tmp_path / name / "final") if d.is_dir())
        saved = json.loads((model_dir / "finetune_model.json").read_text())
        assert saved["spectral_norm"] is (name == "r4f")
