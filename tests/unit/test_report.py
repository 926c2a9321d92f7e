"""`finetune report`: statistics against scipy, grouping by recipe, outputs, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats
from typer.testing import CliRunner

from finetune_cli.cli.main import app
from finetune_cli.metrics.stats import mean_std, paired_stats
from finetune_cli.pipelines.report import build_report
from finetune_cli.recipe import build_recipe

runner = CliRunner()
A = [0.80, 0.82, 0.79, 0.85, 0.81]
B = [0.78, 0.80, 0.80, 0.81, 0.79]


def test_paired_stats_match_scipy():
    out = paired_stats(A, B)
    d = np.array(A) - np.array(B)
    assert out["n"] == 5 and out["diff"] == pytest.approx(d.mean())
    assert out["mean_a"] == pytest.approx(np.mean(A)) and out["mean_b"] == pytest.approx(np.mean(B))
    ref = stats.ttest_rel(A, B)
    assert out["t_pvalue"] == pytest.approx(ref.pvalue)
    ci = ref.confidence_interval(0.95)
    assert out["ci95"] == pytest.approx([ci.low, ci.high])
    # the same interval from the t quantile by hand
    half = stats.t.ppf(0.975, 4) * d.std(ddof=1) / np.sqrt(5)
    assert out["ci95"] == pytest.approx([d.mean() - half, d.mean() + half])
    assert out["wilcoxon_pvalue"] == pytest.approx(stats.wilcoxon(A, B).pvalue)


def test_paired_stats_small_and_degenerate():
    assert paired_stats([], [])["note"] == "no shared seeds"
    one = paired_stats([0.9], [0.8])
    assert one["diff"] == pytest.approx(0.1) and one["ci95"] is None and one["t_pvalue"] is None
    four = paired_stats(A[:4], B[:4])
    assert four["t_pvalue"] == pytest.approx(stats.ttest_rel(A[:4], B[:4]).pvalue)
    assert four["wilcoxon_pvalue"] is None and "at least 5" in four["note"]
    same = paired_stats([0.9, 0.8, 0.7], [0.8, 0.7, 0.6])  # all differences 0.1
    assert same["ci95"] == pytest.approx([0.1, 0.1]) and same["t_pvalue"] is None


def test_mean_std_is_the_sample_std():
    m, s = mean_std(A)
    assert m == pytest.approx(np.mean(A)) and s == pytest.approx(np.std(A, ddof=1))
    assert mean_std([0.5]) == (0.5, None)


def fake_run(root: Path, name: str, seed: int, acc: float, *, objective: str = "ce", lr: float = 1e-3,
             eval_data: str = "dev.tsv", with_eval: bool = True, labels=("0", "1"), refit: bool = False) -> Path:
    run = root / name / f"seed-{seed}"
    run.mkdir(parents=True)
    recipe = {"model": {"name": "embedded"}, "data": {"train": "train.tsv", "eval": "sel.tsv", "seed": None},
              "objective": {"name": objective}, "train": {"seed": seed, "lr": lr},
              "output": {"dir": str(root / name), "name": f"seed-{seed}"}}
    (run / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    (run / "summary.json").write_text(json.dumps({"seed": seed, "labels": list(labels),
                                                  "final_eval": {"accuracy": acc, "f1_macro": acc, "mcc": 0.1,
                                                                 **({"refit_train_accuracy": 1.0} if refit else {})}}))
    if with_eval:
        (run / "eval.json").write_text(json.dumps({
            "data": eval_data, "labels": list(labels), "metrics": {"accuracy": acc, "f1_macro": acc - 0.01, "mcc": 0.5},
            "calibration": {"ece": 1 - acc, "mce": 0.3, "nll": 0.4}}))
    return run


@pytest.fixture
def two_recipes(tmp_path):
    root = tmp_path / "runs"
    for s, (a, b) in enumerate(zip(A, B, strict=True), 1):
        fake_run(root, "scl", s, a, objective="scl")
        fake_run(root, "ce", s, b)
    return root


def test_report_groups_seeds_and_compares(two_recipes):
    rep = build_report([str(two_recipes / "ce"), str(two_recipes / "scl")], ["scl,ce"])
    assert [g.name for g in rep.groups] == ["ce", "scl"] and rep.groups[0].seeds == [1, 2, 3, 4, 5]
    assert rep.metrics == ["accuracy", "f1_macro", "mcc", "ece", "mce", "nll"]
    acc = rep.groups[1].stats["accuracy"]
    assert acc["mean"] == pytest.approx(np.mean(A)) and acc["std"] == pytest.approx(np.std(A, ddof=1))
    c = next(c for c in rep.comparisons if c.metric == "accuracy")
    assert (c.a, c.b, c.n) == ("scl", "ce", 5) and c.t_pvalue == pytest.approx(stats.ttest_rel(A, B).pvalue)
    # ece = 1 - acc, so its difference is the negated accuracy difference
    e = next(c for c in rep.comparisons if c.metric == "ece")
    assert e.diff == pytest.approx(-c.diff)
    # without --compare, two recipes compare the second against the first
    rep2 = build_report([str(two_recipes / "ce"), str(two_recipes / "scl")])
    assert (rep2.comparisons[0].a, rep2.comparisons[0].b) == ("scl", "ce")


def test_report_compares_runs_with_and_without_a_refitted_head(tmp_path):
    """fewshot/ce (train.refit_head: its evaluations add the refit's training accuracy) against
    fewshot/head (none): compared on the metrics both evaluate; two with the refit keep it."""
    root = tmp_path / "runs"
    for s, (a, b) in enumerate(zip(A, B, strict=True), 1):
        fake_run(root, "ce", s, a, with_eval=False, refit=True)
        fake_run(root, "head", s, b, with_eval=False, lr=5e-4)
        fake_run(root, "ce2", s, b, with_eval=False, refit=True, lr=2e-3)
    rep = build_report([str(root / "ce"), str(root / "head")], ["ce,head"])
    assert rep.metrics == ["accuracy", "f1_macro", "mcc"]
    c = next(c for c in rep.comparisons if c.metric == "accuracy")
    assert c.diff == pytest.approx(np.mean(A) - np.mean(B)) and c.n == 5
    assert "refit_train_accuracy" in build_report([str(root / "ce"), str(root / "ce2")]).metrics


def test_fingerprint_ignores_seed_and_output_only():
    def fp(tree):
        return build_recipe(tree).fingerprint(ignore_seeds=True)

    r = {"train": {"seed": 1, "lr": 1e-3}, "data": {"seed": 1}, "output": {"name": "a"}}
    assert fp(r) == fp({"train": {"seed": 2, "lr": 1e-3}, "data": {"seed": 2}, "output": {"name": "b"}})
    assert fp(r) != fp({"train": {"seed": 1, "lr": 2e-3}, "data": {"seed": 1}})
    assert build_recipe(r).fingerprint() != build_recipe({**r, "train": {"seed": 2, "lr": 1e-3}}).fingerprint()


def test_same_name_different_recipe_is_split(tmp_path):
    fake_run(tmp_path / "a", "ce", 1, 0.8)
    fake_run(tmp_path / "b", "ce", 1, 0.7, lr=5e-4)
    rep = build_report([str(tmp_path / "a" / "ce"), str(tmp_path / "b" / "ce")])
    assert rep.groups[0].name == "ce" and rep.groups[1].name.startswith("ce#")


def test_cli_report_table_markdown_json_and_png(two_recipes, tmp_path):
    args = ["report", str(two_recipes / "ce"), str(two_recipes / "scl"), "--compare", "scl,ce"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "mean ± std over seeds" in res.stderr and "paired comparison" in res.stderr
    png = two_recipes / "report.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    res = runner.invoke(app, [*args, "--markdown", "--plot", str(tmp_path / "box.png")])
    assert res.exit_code == 0, res.output
    md = res.stdout
    assert "| recipe | objective | seeds | accuracy |" in md and f"{np.mean(A):.4f} ± {np.std(A, ddof=1):.4f}" in md
    assert "| scl − ce | accuracy | 5 |" in md and (tmp_path / "box.png").is_file()
    res = runner.invoke(app, [*args, "--json", "--no-plot"])
    doc = json.loads(res.stdout)
    assert doc["plot"] is None and len(doc["runs"]) == 10
    acc = next(c for c in doc["comparisons"] if c["metric"] == "accuracy")
    assert acc["wilcoxon_pvalue"] == pytest.approx(stats.wilcoxon(A, B).pvalue)


def _err(res) -> str:
    return [ln for ln in res.stderr.splitlines() if ln.strip()][-1]


def test_cli_report_bad_input(tmp_path):
    root = tmp_path / "runs"
    fake_run(root, "ce", 1, 0.8)
    fake_run(root, "other_task", 1, 0.8, eval_data="other.tsv")
    fake_run(root, "no_eval", 1, 0.8, with_eval=False)
    fake_run(root, "dup", 1, 0.8)
    cases = [
        ([root / "ce", root / "other_task"], "runs are on different tasks:"),
        ([root / "ce", root / "no_eval"], "runs report different metrics:"),
        ([root / "nowhere"], "run directory not found:"),
        ([tmp_path], "is not a finetune run directory (no recipe.yaml) and holds none"),
        ([root / "ce", root / "dup"], "are the same recipe with the same seed 1; keep one"),
    ]
    for paths, message in cases:
        res = runner.invoke(app, ["report", *map(str, paths), "--no-plot"])
        assert res.exit_code == 2, res.output
        assert message in _err(res) and "Traceback" not in res.output
    res = runner.invoke(app, ["report", str(root / "ce"), "--compare", "ce,scl", "--no-plot"])
    assert res.exit_code == 2 and "no recipe named `scl` among the runs (have: ce)" in _err(res)
    (root / "ce" / "seed-1" / "summary.json").unlink()
    res = runner.invoke(app, ["report", str(root / "ce"), "--no-plot"])
    assert res.exit_code == 2 and "is not finished (no summary.json)" in _err(res)


def test_report_without_matplotlib_skips_the_plot_with_a_note(two_recipes, monkeypatch):
    import finetune_cli.viz._mpl as mpl

    monkeypatch.setattr(mpl, "available", lambda: False)
    res = runner.invoke(app, ["report", str(two_recipes / "ce"), str(two_recipes / "scl")])
    assert res.exit_code == 0, res.output
    assert "plot skipped: matplotlib is not installed" in res.stderr and not (two_recipes / "report.png").exists()


def test_report_is_a_listed_subcommand():
    assert "report" in runner.invoke(app, ["--help"]).stdout
    res = runner.invoke(app, ["report", "--help"])
    assert res.exit_code == 0 and "--compare" in res.stdout and "--markdown" in res.stdout
