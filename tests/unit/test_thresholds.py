"""Multi-label decision thresholds: tuned per label on the evaluation rows when best/ and final/ are
saved, kept in finetune_model.json, used by eval and predict unless --threshold says otherwise."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from finetune_cli.cli.main import app
from finetune_cli.metrics.tasks import tuned_thresholds

runner = CliRunner()
LABELS = ["funny", "neg", "pos"]


def _brute_force(y: np.ndarray, p: np.ndarray, default: float) -> np.ndarray:
    """Every candidate (each distinct probability of the label) tried with scikit-learn's F1; the
    best F1 wins, ties to the highest threshold; a label without positives keeps ``default``."""
    from sklearn.metrics import f1_score

    out = []
    for j in range(p.shape[1]):
        if y[:, j].sum() == 0:
            out.append(default)
            continue
        best_t, best_f1 = None, -1.0
        for t in sorted(set(p[:, j].tolist())):
            f1 = f1_score(y[:, j], (p[:, j] >= t).astype(int), zero_division=0)
            if f1 >= best_f1:  # ascending candidates: ``>=`` keeps the highest of equal F1s
                best_t, best_f1 = t, f1
        out.append(best_t)
    return np.asarray(out)


@pytest.mark.parametrize("seed", range(6))
def test_tuned_thresholds_equal_a_brute_force_search(seed):
    rng = np.random.default_rng(seed)
    n, c = 40, 5
    y = (rng.random((n, c)) < [0.5, 0.2, 0.05, 0.8, 0.0]).astype(np.float32)  # the last label: no positives
    p = np.clip(0.5 * y + rng.random((n, c)) * 0.7, 0.0, 0.999)
    p[:, 1] = np.round(p[:, 1], 1)  # many ties between rows
    got = tuned_thresholds(y, p, default=0.37)
    np.testing.assert_array_equal(got, _brute_force(y, p, 0.37))
    assert got[4] == 0.37


def test_tuned_thresholds_by_hand():
    """One label, probabilities .9 .8 .7 .6 with gold 1 0 1 0: t=.9 -> F1 2/3, t=.8 -> 1/2,
    t=.7 -> 4/5, t=.6 -> 2/3, so .7; a perfectly separable label gets its lowest positive."""
    y = np.array([[1, 1], [0, 1], [1, 0], [0, 0]])
    p = np.array([[0.9, 0.95], [0.8, 0.6], [0.7, 0.5], [0.6, 0.1]])
    np.testing.assert_array_equal(tuned_thresholds(y, p), [0.7, 0.6])


# ---- through the CLI ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ml_run(tmp_path_factory, tiny_model_dir) -> tuple[Path, Path]:
    """A 4-step multi-label run of the tiny model (three labels, a row may have none), evaluated
    on its own 24 rows every 2 steps."""
    tmp = tmp_path_factory.mktemp("thresholds")
    sets = [["pos"], ["pos", "funny"], ["neg"], ["neg", "funny"], ["funny"], []] * 4
    f = tmp / "d.csv"
    with f.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["text", "label"])
        w.writerows([(f"review number {i} says {' and '.join(s) or 'nothing'}", ",".join(s))
                     for i, s in enumerate(sets)])
    res = runner.invoke(app, ["train", "-r", "quickstart", f"model.name={tiny_model_dir}", "data.columns.text=text",
                              "train.metric=f1_micro", "model.max_length=32", f"data.train={f}",
                              f"data.eval={f}", "data.label_separator=','", "train.batch_size=8", "train.max_steps=4",
                              "train.eval_every=2", "train.lr=1e-3", f"output.dir={tmp / 'runs'}", "output.name=ml",
                              "--device", "cpu", "-q"])
    assert res.exit_code == 0, res.output
    return tmp / "runs" / "ml", f


def _predict(run: Path, data: Path, out: Path, *flags: str) -> tuple[dict, list[dict]]:
    res = runner.invoke(app, ["predict", str(run), "-i", str(data), "-o", str(out), "--json", "--device", "cpu",
                              "-q", *flags])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), [json.loads(x) for x in out.read_text().splitlines()]


def _gold(data: Path) -> np.ndarray:
    with data.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    return np.array([[k in r["label"].split(",") for k in LABELS] for r in rows], dtype=float)


def test_a_run_saves_thresholds_tuned_on_its_evaluation(ml_run, tmp_path):
    run, data = ml_run
    saved = {d: json.loads((run / d / "finetune_model.json").read_text()) for d in ("best", "final")}
    for spec in saved.values():
        assert len(spec["thresholds"]) == 3 and spec["threshold"] == 0.5
    # best/'s thresholds are the tuning of best/'s own outputs on the evaluation rows
    doc, rows = _predict(run / "best", data, tmp_path / "p.jsonl")
    probs = np.array([[r[f"prob_{k}"] for k in LABELS] for r in rows])
    np.testing.assert_allclose(saved["best"]["thresholds"], tuned_thresholds(_gold(data), probs), atol=1e-6)
    assert "thresholds tuned" in (run / "best" / "README.md").read_text()


def test_predict_uses_the_tuned_thresholds_and_threshold_overrides(ml_run, tmp_path):
    run, data = ml_run
    tuned = json.loads((run / "best" / "finetune_model.json").read_text())["thresholds"]
    doc, rows = _predict(run, data, tmp_path / "a.jsonl")
    assert doc["thresholds"] == dict(zip(LABELS, tuned, strict=True))
    for r in rows:
        assert r["pred_labels"] == [k for k, t in zip(LABELS, tuned, strict=True) if r[f"prob_{k}"] >= t]
    assert _predict(run, data, tmp_path / "t.jsonl", "--threshold", "tuned")[1] == rows
    doc5, rows5 = _predict(run, data, tmp_path / "b.jsonl", "--threshold", "0.5")
    assert doc5["thresholds"] == dict.fromkeys(LABELS, 0.5)
    for r in rows5:
        assert r["pred_labels"] == [k for k in LABELS if r[f"prob_{k}"] >= 0.5]
    # the tiny model's probabilities sit near 0.5: the tuned thresholds decide other labels
    assert [r["pred_labels"] for r in rows] != [r["pred_labels"] for r in rows5]


def test_eval_scores_with_the_tuned_thresholds_unless_told(ml_run, tmp_path):
    from sklearn.metrics import f1_score

    run, data = ml_run
    _, rows = _predict(run, data, tmp_path / "p.jsonl", "--threshold", "0.5")
    probs = np.array([[r[f"prob_{k}"] for k in LABELS] for r in rows])
    tuned = np.array(json.loads((run / "best" / "finetune_model.json").read_text())["thresholds"])
    for flags, cut in (((), tuned), (("--threshold", "0.5"), 0.5)):
        res = runner.invoke(app, ["eval", str(run), "--json", "--device", "cpu", "-q", "--out", str(tmp_path / "e"),
                                  *flags])
        assert res.exit_code == 0, res.output
        doc = json.loads(res.stdout)
        want = f1_score(_gold(data).astype(int), (probs >= cut).astype(int), average="micro", zero_division=0)
        assert doc["metrics"]["f1_micro"] == pytest.approx(want, abs=1e-9)
        assert list(doc["thresholds"].values()) == pytest.approx(np.broadcast_to(cut, 3).tolist())


def test_threshold_refusals_are_one_line(ml_run, tmp_path):
    run, data = ml_run
    bare = Path(shutil.copytree(run / "best", tmp_path / "bare"))  # a multi-label folder without tuned thresholds
    spec = json.loads((bare / "finetune_model.json").read_text())
    del spec["thresholds"]
    (bare / "finetune_model.json").write_text(json.dumps(spec))
    cases = [([str(bare), "--threshold", "tuned"], "--threshold tuned", "has no tuned thresholds"),
             ([str(run), "--threshold", "1.5"], "--threshold 1.5", "between 0 and 1"),
             ([str(run), "--threshold", "nan"], "--threshold nan", "between 0 and 1")]
    for args, *expect in cases:
        out = tmp_path / "p.jsonl"
        res = runner.invoke(app, ["predict", *args, "-i", str(data), "-o", str(out), "--device", "cpu", "-q"])
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), res.output
        assert all(e in lines[0] for e in expect), lines[0]
        assert not out.exists()
    # without --threshold the folder's single threshold decides
    _, rows = _predict(bare, data, tmp_path / "q.jsonl")
    assert all(r["pred_labels"] == [k for k in LABELS if r[f"prob_{k}"] >= 0.5] for r in rows)
    # damaged thresholds are the folder's damage, named
    spec["thresholds"] = [0.5]
    (bare / "finetune_model.json").write_text(json.dumps(spec))
    res = runner.invoke(app, ["predict", str(bare), "-i", str(data), "-o", str(tmp_path / "r.jsonl"), "-q"])
    assert res.exit_code == 2 and "finetune_model.json is damaged" in res.stderr and "thresholds" in res.stderr
