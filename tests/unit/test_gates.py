"""Quality gates (--expect) on `finetune eval` and `finetune train`, the CI example script, the
exit codes in --help and shell completion."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from finetune_cli.cli.main import app
from finetune_cli.errors import FinetuneError
from finetune_cli.metrics.gates import GATE_EXIT, GateFailed, enforce, failures, parse_expectations

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_parse_and_check_expectations():
    e = parse_expectations(["accuracy>=0.85", " ece <= 5e-2", "mcc>0", "nll<1"])
    assert [(x.metric, x.op, x.bound) for x in e] == [("accuracy", ">=", 0.85), ("ece", "<=", 0.05),
                                                      ("mcc", ">", 0.0), ("nll", "<", 1.0)]
    m = {"accuracy": 0.85, "ece": 0.06, "mcc": 0.0, "nll": 0.5}
    assert failures(e, m) == ["ece = 0.0600, expected <= 0.05", "mcc = 0.0000, expected > 0"]
    with pytest.raises(GateFailed) as err:
        enforce(e, m)
    assert err.value.exit_code == GATE_EXIT == 4 and "\n" not in str(err.value)
    enforce(e[:1], m)  # the bound itself passes >=
    for bad in ("accuracy=>0.8", "accuracy>=", ">=0.8", "accuracy>=high", "accuracy"):
        with pytest.raises(FinetuneError, match="--expect"):
            parse_expectations([bad])
    with pytest.raises(FinetuneError, match="no metric `acuracy`.*did you mean `accuracy`") as err:
        enforce(parse_expectations(["acuracy>=0.5"]), m)
    assert not isinstance(err.value, GateFailed) and err.value.exit_code == 2


@pytest.fixture
def trained(tiny_recipe, tmp_path):
    res = runner.invoke(app, ["train", "-r", "quickstart", "-q", *tiny_recipe("train.max_steps=4")])
    assert res.exit_code == 0, res.output
    return tmp_path / "runs" / "tiny"


def test_eval_gates_pass_fail_and_unknown_metric(trained):
    res = runner.invoke(app, ["eval", str(trained), "--no-figures", "--json", "--expect", "accuracy>=0",
                              "--expect", "ece<=1"])
    assert res.exit_code == 0, res.output
    acc = json.loads(res.stdout)["metrics"]["accuracy"]
    assert "quality gates passed" in res.stderr
    res = runner.invoke(app, ["eval", str(trained), "--no-figures", "--expect", "accuracy>=1.01",
                              "--expect", "ece<=1"])
    assert res.exit_code == 4
    lines = [ln for ln in res.stderr.splitlines() if "quality gate failed" in ln]
    assert lines == [f"error: quality gate failed: accuracy = {acc:.4f}, expected >= 1.01"]
    res = runner.invoke(app, ["eval", str(trained), "--no-figures", "--expect", "acc>=0.5"])
    assert res.exit_code == 2 and "no metric `acc`" in res.stderr and "did you mean `accuracy`" in res.stderr
    res = runner.invoke(app, ["eval", str(trained), "--no-figures", "--expect", "accuracy≥0.5"])
    assert res.exit_code == 2 and "--expect" in res.stderr


def test_train_gates_on_final_evaluation(tiny_recipe, tmp_path):
    # unknown metric: refused before anything trains
    res = runner.invoke(app, ["train", "-r", "quickstart", "-q", *tiny_recipe("train.max_steps=4"),
                              "--expect", "ece<=0.1"])
    assert res.exit_code == 2 and "no metric `ece` in the final evaluation of training" in res.stderr
    assert not (tmp_path / "runs" / "tiny").exists()
    res = runner.invoke(app, ["train", "-r", "quickstart", *tiny_recipe("train.max_steps=4"),
                              "--json", "--expect", "mcc>=-1", "--expect", "accuracy>1"])
    assert res.exit_code == 4
    final = json.loads(res.stdout)["final_eval"]
    assert f"accuracy = {final['accuracy']:.4f}, expected > 1" in res.stderr
    res = runner.invoke(app, ["train", "-r", "quickstart", "-q", *tiny_recipe("train.max_steps=4", "output.name=seeds"),
                              "--seeds", "1,2", "--expect", "accuracy>1"])
    assert res.exit_code == 4 and "(seed 1)" in res.stderr and "(seed 2)" in res.stderr


def test_ci_gate_example_script(tiny_model_dir, quickstart_data, tmp_path):
    """examples/ci_gate.sh as CI runs it, on the tiny model: a failing and a passing gate."""
    exe = Path(sys.executable).parent / "finetune"
    if not exe.exists():
        exe = Path(shutil.which("finetune") or "")
        if not exe.name:
            pytest.skip("the finetune command is not installed")
    env = {**os.environ, "PATH": f"{exe.parent}{os.pathsep}{os.environ.get('PATH', '')}", "CI": "1",
           "RUNS": str(tmp_path / "runs")}
    args = [f"model.name={tiny_model_dir}", "model.max_length=32", "data.max_train_samples=32",
            "train.max_steps=2", "train.batch_size=8"]
    script = REPO / "examples" / "ci_gate.sh"
    bad = subprocess.run(["bash", str(script), *args], env={**env, "MIN_ACCURACY": "1.01"}, capture_output=True,
                         text=True, timeout=300)
    assert bad.returncode == 4, bad.stderr
    assert "error: quality gate failed: accuracy = " in bad.stderr and "expected >= 1.01" in bad.stderr
    assert (tmp_path / "runs" / "quickstart" / "summary.json").is_file()
    good = subprocess.run(["bash", str(script), *args], env={**env, "MIN_ACCURACY": "0", "MAX_ECE": "1"},
                          capture_output=True, text=True, timeout=300)
    assert good.returncode == 0, good.stderr


def test_help_lists_exit_codes_and_completion():
    res = runner.invoke(app, ["--help"])
    assert res.exit_code == 0
    text = " ".join(res.output.split())
    for part in ("Exit codes: 0 success", "2 bad input", "3 the run cannot go on", "5 cannot write an output", "4 a quality gate", "130 interrupted",
                 "--install-completion", "--show-completion"):
        assert part in text, part
