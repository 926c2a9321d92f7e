"""``--resume`` takes a checkpoint of this job only: another run's checkpoint (here a SimCSE run's,
whose best "accuracy" would be its Spearman) is refused in one line naming the differing keys,
before anything trains; a checkpoint of the same recipe in another folder is accepted."""

from __future__ import annotations

import shutil

from typer.testing import CliRunner

from finetune_cli.cli.main import app

runner = CliRunner()


def _train(args):
    return runner.invoke(app, ["train", "-r", "quickstart", *args, "--device", "cpu", "-q"])


def test_resume_refuses_another_jobs_checkpoint(tiny_recipe, tmp_path):
    other = tiny_recipe("train.max_steps=2", "train.save_every=2", "objective.label_smoothing=0.2",
                        "~train.metric", "output.name=other")
    assert _train(other).exit_code == 0
    ck = tmp_path / "runs" / "other" / "checkpoint-2"
    assert ck.is_dir()
    res = _train([*tiny_recipe("train.max_steps=4", "~train.metric"), "--resume", str(ck)])
    assert res.exit_code == 2, res.output
    err = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and f"--resume {ck}: checkpoint holds a different run" in err[0]
    assert "objective.label_smoothing: 0.2 there, 0.0 now" in err[0]  # the default it would train with
    assert "train.max_steps: 2 there, 4 now" in err[0]
    assert not (tmp_path / "runs" / "tiny" / "summary.json").exists()


def test_resume_accepts_a_checkpoint_of_the_same_job_elsewhere(tiny_recipe, tmp_path):
    args = tiny_recipe("train.max_steps=4", "train.save_every=2", "~train.metric")
    assert _train([*args, "output.name=first"]).exit_code == 0
    ck = tmp_path / "copy" / "checkpoint-2"
    shutil.copytree(tmp_path / "runs" / "first" / "checkpoint-2", ck)
    res = _train([*args, "--resume", str(ck), "--json"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "runs" / "tiny" / "summary.json").is_file()
