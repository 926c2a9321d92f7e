"""A recipe is resolved once into a ``Plan``, and one table says which metrics an evaluation
computes: ``train.metric``, ``--expect`` and ``sweep --metric`` accept exactly what training's
evaluation reports, for every problem type (regression and multi-label included)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from finetune_cli.cli.main import app
from finetune_cli.errors import RecipeError
from finetune_cli.metrics.names import METRIC_NAMES, metric_names
from finetune_cli.pipelines.recipes import load_plan
from finetune_cli.pipelines.train import run_train
from finetune_cli.ui import UI

runner = CliRunner()


def _regression(tmp_path, tiny_model_dir) -> list[str]:
    rows = [("a cat sat on the mat", "a cat is on the mat", 4.5), ("dogs bark", "it rains today", 0.5),
            ("i like tea", "i enjoy tea", 4.0), ("the sky is blue", "cars are fast", 0.2)] * 4
    f = tmp_path / "reg.tsv"
    f.write_text("s1\ts2\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in rows))
    return [f"model.name={tiny_model_dir}", "model.max_length=32", "model.problem_type=regression",
            f"data.train={f}", f"data.eval={f}", "data.columns.text=s1", "data.columns.text_pair=s2",
            "data.columns.label=score", "train.batch_size=8", "train.max_steps=2", "train.eval_every=2",
            "~train.metric", f"output.dir={tmp_path / 'runs'}", "output.name=reg"]


def _multi_label(tmp_path, tiny_model_dir) -> list[str]:
    sets = [["pos"], ["pos", "funny"], ["neg"], ["neg", "funny"], ["funny"], []] * 3
    f = tmp_path / "ml.jsonl"
    f.write_text("".join(json.dumps({"text": f"review {i}: {' and '.join(s) or 'nothing'}", "label": s}) + "\n"
                         for i, s in enumerate(sets)))
    return [f"model.name={tiny_model_dir}", "model.max_length=32", "model.problem_type=multi_label_classification",
            f"data.train={f}", f"data.eval={f}", "data.columns.text=text", "train.batch_size=8", "train.max_steps=2",
            "train.eval_every=2", "~train.metric", f"output.dir={tmp_path / 'runs'}", "output.name=ml"]


KINDS = {"regression": (_regression, "float"), "multi-label": (_multi_label, "multi")}


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_plan_names_what_training_evaluates(tmp_path, tiny_model_dir, kind):
    """The plan's metric names are the keys of the final evaluation a real run writes."""
    make, label_type = KINDS[kind]
    plan = load_plan(None, make(tmp_path, tiny_model_dir))
    assert plan.label_type == label_type and plan.metrics == METRIC_NAMES[label_type]
    out = run_train(plan, UI(quiet=True), device="cpu")
    assert set(out.summary["final_eval"]) == set(plan.metrics)
    assert out.summary["metric"] == plan.metrics[0] == plan.recipe.train.metric


def test_plans_of_the_other_kinds(tiny_recipe):
    ce = load_plan(None, tiny_recipe())
    assert (ce.label_type, ce.evaluation, ce.metrics) == ("class", "classifier", metric_names("class"))
    assert ce.text_columns == ("text", "text_pair") and ce.joint and ce.params == {"label_smoothing": 0.0, "class_weights": None}
    sim = load_plan("simcse_unsup")
    assert (sim.label_type, sim.evaluation, sim.metrics) == (None, "similarity", ("spearman", "pearson"))
    assert not sim.joint and sim.recipe.train.metric == "spearman"
    refit = load_plan(None, tiny_recipe("model.head=pooled", "train.refit_head=true"))
    assert refit.metrics[-1] == "refit_train_accuracy"


@pytest.mark.parametrize("kind, good, bad", [
    ("regression", "pearson>=-1", "accuracy>=0.5"),
    ("multi-label", "f1_micro>=0", "accuracy>=0.5"),
])
def test_expect_accepts_what_training_computes_and_refuses_the_rest_before_training(
        tmp_path, tiny_model_dir, kind, good, bad):
    """`--expect` on a metric training computes runs and passes; on one it does not compute it is
    refused in one line before anything trains (no run folder left)."""
    args = ["train", "-r", "quickstart", *KINDS[kind][0](tmp_path, tiny_model_dir), "--device", "cpu", "-q"]
    res = runner.invoke(app, [*args, "--expect", bad])
    assert res.exit_code == 2, res.output
    assert "no metric `accuracy` in the final evaluation of training" in res.stderr
    assert not (tmp_path / "runs").exists()
    res = runner.invoke(app, [*args, "--expect", good])
    assert res.exit_code == 0, res.output
    assert any((tmp_path / "runs").glob("*/summary.json"))


@pytest.mark.parametrize("kind, good, bad", [
    ("regression", "spearman", "accuracy"),
    ("multi-label", "f1_micro", "accuracy"),
])
def test_sweep_metric_follows_the_same_table(tmp_path, tiny_model_dir, kind, good, bad):
    pytest.importorskip("optuna")
    base = KINDS[kind][0](tmp_path, tiny_model_dir)
    args = ["sweep", "-r", "quickstart", *base, "--param", "train.lr=choice:0.001,0.002", "--trials", "1", "--seeds", "1",
            "--no-baseline", "--device", "cpu", "--out", str(tmp_path / "sw"), "--json"]
    res = runner.invoke(app, [*args, "--metric", bad])
    assert res.exit_code == 2 and f"--metric {bad}: training of this recipe evaluates" in res.stderr, res.output
    assert not (tmp_path / "sw").exists()
    res = runner.invoke(app, [*args, "--metric", good])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["metric"] == good and out["best"]["mean"] is not None


def test_train_metric_is_checked_against_the_same_table(tmp_path, tiny_model_dir):
    with pytest.raises(RecipeError, match="`train.metric` .* is `accuracy`, which objective `ce` does not compute"):
        load_plan(None, [*_multi_label(tmp_path, tiny_model_dir), "train.metric=accuracy"])
    assert load_plan(None, [*_multi_label(tmp_path, tiny_model_dir), "train.metric=subset_accuracy"]).metrics
