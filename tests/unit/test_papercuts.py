"""What a new user hits first, each through the real CLI: the help text, `embed -i`, Trainer
vocabulary, a recipe given as an argument, group-readable weights, and no folder left by a refused start."""

from __future__ import annotations

import os
import re
import stat

import numpy as np
import pytest
from typer.testing import CliRunner

from finetune_cli.cli.main import app

runner = CliRunner()
COMMANDS = [["train"], ["eval"], ["augment"], ["embed"], ["predict"], ["export"], ["push"], ["report"], ["sweep"],
            ["recipes", "list"], ["probe"], []]


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c) or "finetune")
def test_help_at_80_columns_reads_as_text(cmd):
    res = runner.invoke(app, [*cmd, "--help"], terminal_width=80, env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    out = res.output
    assert not re.search(r"<(str|bool|int|float|int range|float range)>", out), out
    assert "``" not in out and not re.search(r"\w…", out), out  # (a word rich cut short ends in …)
    assert max(len(line) for line in out.splitlines()) <= 80


def test_embed_takes_its_input_as_predict_does(tmp_path, tiny_model_dir):
    src = tmp_path / "s.txt"
    src.write_text("one sentence\nanother one\n")
    outs = []
    for i, args in enumerate(([str(src)], ["-i", str(src)], ["--input", str(src)])):
        res = runner.invoke(app, ["embed", str(tiny_model_dir), *args, "-o", str(tmp_path / f"{i}.npy"), "--device",
                                  "cpu"])
        assert res.exit_code == 0, res.output
        outs.append(np.load(tmp_path / f"{i}.npy"))
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])
    for args in ([], [str(src), "-i", str(src)]):
        res = runner.invoke(app, ["embed", str(tiny_model_dir), *args, "-o", str(tmp_path / "x.npy")])
        assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1 and "--input" in res.output


@pytest.mark.parametrize("override, pointer", [
    ("train.load_best_model_at_end=true", "best/"), ("push_to_hub=true", "output.push_to_hub"),
    ("train.hub_model_id=me/x", "output.push_to_hub"), ("train.adam_beta1=0.8", "betas (0.9, 0.999)"),
    ("train.adam_beta2=0.9", "betas (0.9, 0.999)"), ("train.adam_epsilon=1e-6", "eps (1e-8)"),
    ("train.resume_from_checkpoint=x", "--resume"), ("train.evaluation_strategy=steps", "train.eval_every"),
    ("train.optimizer=adamw_torch", "did you mean `adamw`"),
    ("train.lr_scheduler=cosine_with_restarts", "did you mean `cosine"),
])
def test_more_trainer_names_point_to_our_keys(override, pointer):
    res = runner.invoke(app, ["recipes", "validate", "quickstart", override])
    assert res.exit_code == 2, res.output
    line, = res.output.strip().splitlines()
    assert pointer in line and "Trainer" in line, line


def test_a_recipe_given_as_an_argument_suggests_the_option():
    res = runner.invoke(app, ["train", "quickstart", "train.epochs=1"])
    assert res.exit_code == 2 and "did you mean `finetune train -r quickstart`?" in res.output, res.output


def test_saved_weights_are_as_readable_as_the_folder_and_a_refused_start_leaves_no_folder(tiny_recipe, tmp_path):
    old = os.umask(0o022)
    try:
        res = runner.invoke(app, ["train", "-r", "quickstart", *tiny_recipe("train.max_steps=1", "~data.eval",
                                                                            "~train.metric"), "--device", "cpu", "-q"])
        assert res.exit_code == 0, res.output
        for f in (tmp_path / "runs" / "tiny" / "final").iterdir():
            if f.is_file():
                assert stat.S_IMODE(f.stat().st_mode) == 0o644, f
        bad = tmp_path / "bad.tsv"
        bad.write_text("sentence\tlabel\nonly one field\n")
        for extra in ([f"data.train={bad}"], ["model.name=/no/such/model"]):
            res = runner.invoke(app, ["train", "-r", "quickstart", *tiny_recipe(*extra, "output.name=refused"),
                                      "--device", "cpu", "-q"])
            assert res.exit_code != 0 and not (tmp_path / "runs" / "refused").exists(), res.output
    finally:
        os.umask(old)


def test_evaluation_records_carry_the_fractional_epoch(tiny_recipe):
    """An evaluation record's ``epoch`` is where the run stands, as its step's training record says
    (an integer epoch index made the card show "—" and TensorBoard's epoch axis drop to 0)."""
    import json

    from finetune_cli.pipelines.recipes import load_plan
    from finetune_cli.pipelines.train import run_train
    from finetune_cli.ui import UI

    out = run_train(load_plan(None, tiny_recipe("train.eval_every=3", "train.log_every=1", "train.epochs=2")),
                    UI(quiet=True), device="cpu")
    recs = [json.loads(x) for x in (out.run_dir / "metrics.jsonl").read_text().splitlines()]
    train = {r["step"]: r["epoch"] for r in recs if "loss" in r}
    evals = [r for r in recs if "eval/accuracy" in r]
    assert [e["step"] for e in evals] == [3, 6, 9, 12, 15, 16]
    assert all(e["epoch"] == train[e["step"]] for e in evals), (evals, train)
    assert evals[0]["epoch"] == 0.375 and evals[-1]["epoch"] == 2.0
