"""`finetune train --seeds`, `finetune eval` in depth and `finetune report` on real (tiny) runs."""

from __future__ import annotations

import json

import pytest

from finetune_cli.metrics.names import metric_names
from finetune_cli.pipelines.multiseed import parse_seeds
from finetune_cli.recipe import RecipeError
from tests.unit._cli import invoke

PNG = b"\x89PNG\r\n\x1a\n"


def test_parse_seeds():
    assert parse_seeds("1,2,3") == [1, 2, 3]
    assert parse_seeds("1-3, 7") == [1, 2, 3, 7]
    for bad, msg in (("1,a", "comma-separated integers"), ("3-1", "is empty"), ("1,1", "seed 1 twice")):
        with pytest.raises(RecipeError, match=msg):
            parse_seeds(bad)


def test_train_seeds_resume_eval_and_report(tiny_recipe, tmp_path):
    base = tiny_recipe("~data.max_train_samples", "data.few_shot=12")
    res = invoke("train", "-r", "quickstart", *base, "--seeds", "1,2", "--json", "-q", "--device", "cpu")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    root = tmp_path / "runs" / "tiny"
    assert [r["seed"] for r in rows] == [1, 2] and [r["status"] for r in rows] == ["trained", "trained"]
    assert [r["run_dir"] for r in rows] == [str(root / "seed-1"), str(root / "seed-2")]
    assert all(r["train_examples"] == 24 for r in rows)  # 12 per class, two classes
    # the seed also draws the few-shot sample: the two seeds train on different sentences
    from finetune_cli.data.sources import read_file
    from finetune_cli.data.tasks import few_shot_indices

    labels = read_file(base[2].split("=", 1)[1], {"text": "sentence", "label": "label"}).columns["label"]
    assert few_shot_indices(labels, 12, 1) != few_shot_indices(labels, 12, 2)

    # rerun: finished seeds are skipped, their files untouched
    mtime = (root / "seed-1" / "summary.json").stat().st_mtime_ns
    res = invoke("train", "-r", "quickstart", *base, "--seeds", "1,2", "--json", "-q", "--device", "cpu")
    assert res.exit_code == 0, res.output
    assert [r["status"] for r in json.loads(res.stdout)] == ["skipped (complete)"] * 2
    assert (root / "seed-1" / "summary.json").stat().st_mtime_ns == mtime
    assert [r["best_metric"] for r in json.loads(res.stdout)] == [r["best_metric"] for r in rows]

    # eval in depth: one JSON document, eval.json and figures in the run directory
    res = invoke("eval", str(root / "seed-1"), "--json", "-q", "--bins", "10")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert set(doc["metrics"]) == set(metric_names("class"))
    assert doc["labels"] == ["negative", "positive"] and [r["label"] for r in doc["per_class"]] == doc["labels"]
    cm = doc["confusion_matrix"]
    assert sum(map(sum, cm)) == doc["examples"] == 100
    assert [sum(row) for row in cm] == [r["support"] for r in doc["per_class"]]
    assert (cm[0][0] + cm[1][1]) / 100 == pytest.approx(doc["metrics"]["accuracy"])
    cal = doc["calibration"]
    assert cal["n_bins"] == 10 and sum(b["count"] for b in cal["bins"]) == 100 and 0 <= cal["ece"] <= cal["mce"] + 1e-9
    figs = root / "seed-1" / "figures"
    assert doc["figures"] == {"reliability": str(figs / "reliability.png"), "tsne": str(figs / "tsne.png")}
    for f in ("reliability.png", "tsne.png"):
        assert (figs / f).read_bytes()[:8] == PNG
    assert json.loads((root / "seed-1" / "eval.json").read_text())["calibration"]["ece"] == cal["ece"]

    # --out puts the files elsewhere; --no-figures writes only eval.json
    out = tmp_path / "ev"
    res = invoke("eval", str(root / "seed-2"), "--out", str(out), "--no-figures")
    assert res.exit_code == 0, res.output
    assert (out / "eval.json").is_file() and not (out / "figures").exists()
    assert "ece (15 bins)" in res.stderr and "confusion matrix" in res.stderr

    # report: seed-1 has eval.json, seed-2 does not -> different metrics, one clear line
    res = invoke("report", str(root), "--no-plot")
    assert res.exit_code == 2 and "runs report different metrics" in res.stderr
    assert invoke("eval", str(root / "seed-2"), "-q", "--no-figures").exit_code == 0
    res = invoke("report", str(root), "--json")
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert [g["seeds"] for g in rep["groups"]] == [[1, 2]] and rep["groups"][0]["name"] == "tiny"
    assert rep["plot"] == str(root / "report.png") and (root / "report.png").read_bytes()[:8] == PNG


def test_train_seeds_rejects_resume(tiny_recipe):
    res = invoke("train", "-r", "quickstart", *tiny_recipe(), "--seeds", "1", "--resume", "x", "-q")
    assert res.exit_code == 2 and "cannot be used with --seeds" in res.stderr
    res = invoke("train", "-r", "quickstart", *tiny_recipe(), "--seeds", "1,x", "-q")
    assert res.exit_code == 2 and "--seeds must be comma-separated integers" in res.stderr
