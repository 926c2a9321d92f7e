"""The metrics papers report (F1 of the positive class, precision, recall, ROC-AUC, PR-AUC): against
scikit-learn called directly, and through the CLI (``train.metric=f1``, ``--expect``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.metrics import (
    average_precision_score,
    f1_score,
    precision_score,
    recall_score,
    roc_auc_score,
)

from finetune_cli.metrics.classification import classification_metrics
from finetune_cli.metrics.names import metric_names
from finetune_cli.metrics.tasks import softmax, task_metrics
from tests.unit._cli import invoke, one_error_line


def _logits(n: int, c: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, c, n)
    logits = rng.normal(size=(n, c)) + 1.5 * np.eye(c)[y] * rng.random((n, 1))
    return logits, y


def test_binary_metrics_are_sklearns_on_the_positive_class():
    logits, y = _logits(200, 2, 0)
    m = task_metrics("class", logits, y)
    pred, p1 = logits.argmax(-1), softmax(logits)[:, 1]
    assert m["f1"] == pytest.approx(f1_score(y, pred))  # GLUE's MRPC/QQP F1: pos_label=1
    assert m["precision"] == pytest.approx(precision_score(y, pred))
    assert m["recall"] == pytest.approx(recall_score(y, pred))
    assert m["roc_auc"] == pytest.approx(roc_auc_score(y, p1))
    assert m["pr_auc"] == pytest.approx(average_precision_score(y, p1))
    assert m["f1"] != pytest.approx(m["f1_macro"])  # not the macro average
    assert set(m) == set(metric_names("class"))  # the one table lists what is computed


def test_multiclass_metrics_are_macro_and_one_vs_rest():
    logits, y = _logits(300, 4, 1)
    m = task_metrics("class", logits, y)
    pred, p = logits.argmax(-1), softmax(logits)
    assert m["precision"] == pytest.approx(precision_score(y, pred, average="macro"))
    assert m["recall"] == pytest.approx(recall_score(y, pred, average="macro"))
    assert m["f1"] == pytest.approx(m["f1_macro"])
    assert m["roc_auc"] == pytest.approx(roc_auc_score(y, p, multi_class="ovr", average="macro"))
    ref = np.mean([average_precision_score(y == c, p[:, c]) for c in range(4)])
    assert m["pr_auc"] == pytest.approx(ref)


def test_auc_left_out_with_a_reason_when_a_class_has_no_gold_row():
    logits, y = _logits(50, 3, 2)
    y[y == 2] = 0
    notes: dict[str, str] = {}
    m = classification_metrics(y, logits.argmax(-1), softmax(logits), notes)
    assert "roc_auc" not in m and "pr_auc" not in m and "accuracy" in m
    assert "class id 2 has no gold row" in notes["roc_auc"]


def test_train_metric_f1_through_the_cli(tiny_recipe, tmp_path):
    res = invoke("train", "-r", "quickstart", *tiny_recipe("train.metric=f1"), "--device", "cpu",
                 "--expect", "pr_auc>=0", "--json", "-q")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["metric"] == "f1"
    final = summary["final_eval"]
    assert {"f1", "precision", "recall", "roc_auc", "pr_auc"} <= set(final)
    assert summary["best_metric"] == final["f1"]  # one evaluation: best is it, chosen by F1
    # `eval` recomputes them from best/, and the gate reads them
    res = invoke("eval", tmp_path / "runs" / "tiny", "--json", "-q", "--expect", "f1>=0", "--no-figures")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)["metrics"]
    assert out["f1"] == pytest.approx(final["f1"]) and out["roc_auc"] == pytest.approx(final["roc_auc"], abs=1e-6)
    res = invoke("eval", tmp_path / "runs" / "tiny", "-q", "--expect", "roc_auc>=1.01", "--no-figures")
    assert res.exit_code == 4 and "roc_auc" in res.stderr


def test_unknown_metric_names_the_new_ones(tiny_recipe):
    res = invoke("train", "-r", "quickstart", *tiny_recipe("train.metric=f1_score"))
    assert res.exit_code != 0
    assert "f1" in one_error_line(res)
