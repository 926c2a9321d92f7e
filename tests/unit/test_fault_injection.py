"""Fault injection for run directories: a write that dies mid-checkpoint (a full disk), and each
file of the newest checkpoint damaged in turn. Every time, the next run resumes from the newest
*intact* checkpoint (with a warning naming the damaged one) and ends with the same weights and the
same ``metrics.jsonl`` as a run that was never disturbed.
"""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from finetune_cli.cli.main import app
from finetune_cli.pipelines.recipes import load_plan
from finetune_cli.pipelines.train import run_train
from finetune_cli.ui import UI

COMMON = ("train.max_steps=6", "train.save_every=1", "train.eval_every=3", "train.keep_checkpoints=3",
          "train.batch_size=4")


class Warnings(UI):
    def __init__(self):
        super().__init__(quiet=True)
        self.warnings: list[str] = []

    def warn(self, msg: str) -> None:
        self.warnings.append(msg)


def _train(overrides, callbacks=(), ui=None):
    return run_train(load_plan(None, overrides), ui or UI(quiet=True), device="cpu", callbacks=callbacks)


def _weights(d: Path) -> dict[str, torch.Tensor]:
    w = load_file(str(d / "model.safetensors"))
    w.update({f"head.{k}": v for k, v in load_file(str(d / "finetune_head.safetensors")).items()})
    return w


def _metrics(run: Path) -> list[dict]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in x.items() if k != "samples_per_s"} for x in lines]


def _assert_same_run(a: Path, b: Path) -> None:
    wa, wb = _weights(a / "final"), _weights(b / "final")
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    assert _metrics(a) == _metrics(b)


class _CrashAt:
    def __init__(self, step: int):
        self.step = step

    def __call__(self, trainer, state):
        if state.step == self.step:
            raise RuntimeError("simulated crash")


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    """The reference (never disturbed) run and a run cut after checkpoint-5 (checkpoints 3, 4, 5)."""
    from tests.conftest import QUICKSTART

    base = tmp_path_factory.mktemp("fault")

    def recipe(out: Path) -> list[str]:
        return [f"model.name={tiny_model_dir}", "model.max_length=32", f"data.train={QUICKSTART / 'train.tsv'}",
                f"data.eval={QUICKSTART / 'dev.tsv'}", "data.columns.text=sentence", "data.max_train_samples=64",
                "train.lr=1e-3", "train.log_every=2", f"output.dir={out}", "output.name=tiny",
                "model.head=pooled", *COMMON]  # pooled: the head file is one more file to damage

    ref = _train(recipe(base / "ref")).run_dir
    with pytest.raises(RuntimeError):
        _train(recipe(base / "cut"), callbacks=[_CrashAt(5)])
    cut = base / "cut" / "tiny"
    assert sorted(p.name for p in cut.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-4", "checkpoint-5"]
    return {"ref": ref, "cut": cut, "recipe": recipe}


def _copy_cut(runs, dest: Path) -> tuple[Path, list[str]]:
    run = dest / "tiny"
    shutil.copytree(runs["cut"], run)
    return run, runs["recipe"](dest)


def _damage(f: Path, how: str) -> None:
    data = f.read_bytes()
    if how == "truncate":
        f.write_bytes(data[: len(data) // 2])
    else:
        f.write_bytes(b"\x80garbage, not what was saved\x00" * 3)


def _resume_after_damage(runs, tmp_path, rel: str, how: str) -> None:
    run, recipe = _copy_cut(runs, tmp_path)
    _damage(run / "checkpoint-5" / rel, how)
    ui = Warnings()
    out = _train(recipe, ui=ui)
    assert out.resumed_from is not None and out.resumed_from.name == "checkpoint-4", (rel, how)
    assert any("checkpoint-5" in w and Path(rel).name in w for w in ui.warnings), ui.warnings
    _assert_same_run(runs["ref"], run)


# The files whose damage a reader meets first; every file in turn is the slow test below.
@pytest.mark.parametrize("rel, how", [
    ("trainer_state.json", "truncate"),
    ("model/model.safetensors", "truncate"),
    ("model/finetune_head.safetensors", "garbage"),
    ("model/config.json", "truncate"),
    ("optimizer.json", "garbage"),
    ("optimizer.safetensors", "truncate"),
    ("rng-0.json", "truncate"),
    ("scheduler.json", "garbage"),
])
def test_damaged_newest_checkpoint_resumes_from_the_previous_one(runs, tmp_path, rel, how):
    _resume_after_damage(runs, tmp_path, rel, how)


@pytest.mark.slow
def test_each_file_of_the_newest_checkpoint_damaged_in_turn(runs, tmp_path):
    files = sorted(str(p.relative_to(runs["cut"] / "checkpoint-5"))
                   for p in (runs["cut"] / "checkpoint-5").rglob("*") if p.is_file())
    assert len(files) >= 8, files
    # Damage that leaves a file that still parses the same cannot be seen and changes nothing (e.g.
    # half of a vocab.txt the fast tokenizer never reads): the run must then still end the same.
    for i, rel in enumerate(files):
        d = tmp_path / str(i)
        run, recipe = _copy_cut(runs, d)
        _damage(run / "checkpoint-5" / rel, "truncate")
        out = _train(recipe, ui=Warnings())
        assert out.resumed_from is not None, rel
        _assert_same_run(runs["ref"], run)


def test_no_intact_checkpoint_refuses_with_one_line(runs, tmp_path):
    run, recipe = _copy_cut(runs, tmp_path)
    for ck in ("checkpoint-3", "checkpoint-4", "checkpoint-5"):
        _damage(run / ck / "trainer_state.json", "truncate")
    empty = tmp_path / "defaults.yaml"  # the recipe _train builds: defaults plus the overrides
    empty.write_text("{}\n")
    res = CliRunner().invoke(app, ["train", "-r", str(empty), *recipe, "--device", "cpu", "-q"])
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.stderr
    assert "no intact checkpoint" in lines[0] and "checkpoint-5: trainer_state.json" in lines[0]


def test_torn_last_metrics_line_is_dropped(runs, tmp_path):
    run, recipe = _copy_cut(runs, tmp_path)
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 6, "epoch": 0.37, "lo')  # a crash mid-write
    out = _train(recipe)
    assert out.resumed_from.name == "checkpoint-5"
    _assert_same_run(runs["ref"], run)


def test_crash_before_the_first_checkpoint_restarts_the_log(runs, tmp_path):
    recipe = [*runs["recipe"](tmp_path), "train.save_every=100"]
    ref = [*runs["recipe"](tmp_path / "ref"), "train.save_every=100"]
    with pytest.raises(RuntimeError):
        _train(recipe, callbacks=[_CrashAt(4)])
    run = tmp_path / "tiny"
    assert not list(run.glob("checkpoint-*")) and _metrics(run)  # a log, nothing to resume from
    out = _train(recipe)
    assert out.resumed_from is None
    _assert_same_run(_train(ref).run_dir, run)  # no step logged twice


@pytest.mark.parametrize("fail_at", ["model", "optimizer", "trainer_state.json"])
def test_full_disk_mid_checkpoint_keeps_the_previous_one(runs, tmp_path, monkeypatch, fail_at):
    """The disk fills while checkpoint-4 is written: one line naming the disk and the file, no
    partial checkpoint, checkpoint-3 kept; after space is freed the rerun resumes and ends the same."""
    import finetune_cli.checkpoint as ckpt
    import finetune_cli.engine.trainer as tr

    recipe = runs["recipe"](tmp_path)
    full = OSError(errno.ENOSPC, "No space left on device")
    real_save, real_write_text = ckpt.save_state, Path.write_text

    def in_ck4(p) -> bool:
        return ".checkpoint-4." in str(p)

    def save(obj, directory, name):
        if in_ck4(directory) and name == fail_at:
            full.filename = str(Path(directory) / f"{name}.safetensors")
            raise full
        return real_save(obj, directory, name)

    def write_text(self, *a, **k):
        if in_ck4(self) and self.name == fail_at:
            full.filename = str(self)
            raise full
        return real_write_text(self, *a, **k)

    monkeypatch.setattr(ckpt, "save_state", save)
    monkeypatch.setattr(Path, "write_text", write_text)
    if fail_at == "model":
        real_init = tr.Trainer.__init__

        def init(self, *a, **k):
            real_init(self, *a, **k)
            inner = self.save_model_fn

            def save_model_fn(m, out):
                if in_ck4(out):
                    full.filename = str(Path(out) / "model.safetensors")
                    raise full
                return inner(m, out)
            self.save_model_fn = save_model_fn
        monkeypatch.setattr(tr.Trainer, "__init__", init)

    empty = tmp_path / "defaults.yaml"
    empty.write_text("{}\n")
    res = CliRunner().invoke(app, ["train", "-r", str(empty), *recipe, "--device", "cpu", "-q"])
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == 5 and len(lines) == 1, res.output
    assert "no space left" in lines[0] and "checkpoint-4" in lines[0] and str(tmp_path) in lines[0], lines[0]
    run = tmp_path / "tiny"
    names = sorted(p.name for p in run.iterdir())
    assert "checkpoint-3" in names and "checkpoint-4" not in names, names
    assert not [n for n in names if n.endswith(".tmp")], names
    monkeypatch.undo()
    out = _train(recipe)
    assert out.resumed_from.name == "checkpoint-3"
    _assert_same_run(runs["ref"], run)
