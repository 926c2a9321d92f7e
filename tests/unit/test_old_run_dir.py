"""A run directory written by the release before the architecture change (tests/fixtures/run_v0,
made by tests/fixtures/make_run_v0.py at commit 805a508) still evaluates and resumes.

Its classifier folders are the old format (a plain BertModel + ``finetune_head.safetensors`` with a
mean-pooling head, no ``model.head`` in its recipe): finetune loads them transparently as pooled
classifiers, and its recipe reads as ``model.head: pooled``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from finetune_cli.cli.main import app
from finetune_cli.pipelines.recipes import load_recipe
from finetune_cli.pipelines.train import run_train
from finetune_cli.ui import UI

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "run_v0"
OVERRIDES = ["model.name=model_src", "model.max_length=32", "data.train=data/train.tsv", "data.eval=data/dev.tsv",
             "data.columns.text=sentence", "train.batch_size=8", "train.max_steps=8", "train.eval_every=4",
             "train.lr=1e-3", "train.log_every=2", "output.dir=runs"]
runner = CliRunner()


@pytest.fixture
def old(tmp_path, monkeypatch):
    root = tmp_path / "run_v0"
    shutil.copytree(FIXTURE, root)
    monkeypatch.chdir(root)
    return root


def test_old_run_evaluates_as_it_did(old):
    res = runner.invoke(app, ["eval", "runs/old", "--json", "--no-figures", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    # the number the old release printed for this run (see the fixture's make script)
    assert json.loads(res.stdout)["metrics"]["accuracy"] == pytest.approx(0.46875)


def test_old_run_resumes_and_ends_as_an_uninterrupted_run(old):
    # the fixture was trained from the recipe defaults of its day plus these overrides (no recipe
    # file); its head was model.pooling + linear, which is `model.head=pooled` now
    out = run_train(load_recipe(None, [*OVERRIDES, "model.head=pooled", "output.name=old"]), UI(quiet=True),
                    device="cpu")
    assert out.resumed_from == Path("runs/old/checkpoint-4") and out.summary["steps"] == 8
    run_train(load_recipe(None, [*OVERRIDES, "model.head=pooled", "output.name=fresh"]), UI(quiet=True),
              device="cpu")
    resumed = load_file("runs/old/final/model.safetensors")
    fresh = load_file("runs/fresh/final/model.safetensors")
    assert resumed.keys() == fresh.keys()
    assert all(torch.allclose(resumed[k], fresh[k], atol=1e-6) for k in fresh)
    # the log of the resumed run is the log of the uninterrupted one
    def steps(run):
        return [json.loads(ln)["step"] for ln in Path(run, "metrics.jsonl").read_text().splitlines()]

    assert steps("runs/old") == steps("runs/fresh")


def test_old_run_with_todays_default_head_is_refused_in_one_line(old):
    from finetune_cli.errors import RunDirError

    with pytest.raises(RunDirError) as e:
        run_train(load_recipe(None, [*OVERRIDES, "output.name=old"]), UI(quiet=True), device="cpu")
    assert "model.head: 'pooled' there, 'native' now" in str(e.value) and "\n" not in str(e.value)


def test_old_run_predicts_with_its_trained_head(old, tmp_path):
    res = runner.invoke(app, ["predict", "runs/old", "--input", "data/dev.tsv", "--output", str(tmp_path / "p.csv"),
                              "--column", "sentence", "--json", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    import csv

    rows = list(csv.DictReader((tmp_path / "p.csv").open()))
    gold = [r["label"] for r in csv.DictReader(Path("data/dev.tsv").open(), delimiter="\t")]
    acc = sum(r["pred_label"] == g for r, g in zip(rows, gold, strict=True)) / len(gold)
    assert acc == pytest.approx(0.46875)  # the old release's accuracy: the head was loaded, not re-drawn
