"""`finetune probe`: schema, plan, splits, the probe's read-only encoder, stages, resume, CLI errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from finetune_cli.cli.main import app
from finetune_cli.data.probe_tasks import Protocol, make_protocol, materialize_task
from finetune_cli.metrics.probe import probe_summary
from finetune_cli.pipelines import probe as P
from finetune_cli.pipelines.recipes import load_any, load_probe_recipe, load_recipe
from finetune_cli.recipe import RecipeError

runner = CliRunner()


def probe_yaml(tmp_path: Path, model_dir: Path, quickstart: dict, extra_tasks: str = "", sequence="[a, b]") -> Path:
    """Two tiny tasks from the quickstart data: `a` (train/dev files) and `b` (train file cut in two)."""
    text = f"""# tiny probe recipe
model: {{name: "{model_dir}", max_length: 32}}
objective: ce
train: {{epochs: 1, batch_size: 8, lr: 1.0e-3, seed: 3}}
output: {{dir: "{tmp_path / 'runs'}", name: p}}
probe:
  sequence: {sequence}
  classifier: {{max_iter: 50}}
  tasks:
    a:
      data: {{train: "{quickstart['train']}", eval: "{quickstart['eval']}", columns: {{text: sentence}},
             max_train_samples: 40, max_eval_samples: 24}}
    b:
      data: {{train: "{quickstart['train']}", columns: {{text: sentence}}, max_train_samples: 32, max_eval_samples: 16,
             seed: 5}}
      split: {{source: train, eval_fraction: 0.25}}
{extra_tasks}"""
    p = tmp_path / "probe.yaml"
    p.write_text(text)
    return p


@pytest.fixture
def recipe_file(tmp_path, tiny_model_dir, quickstart_data):
    return probe_yaml(tmp_path, tiny_model_dir, quickstart_data)


def encoder_state(path) -> dict[str, torch.Tensor]:
    from finetune_cli.models.loading import load_encoder

    return {k: v.clone() for k, v in load_encoder(str(path)).state_dict().items()}


# ---- schema and plan --------------------------------------------------------------------------

def test_probe_recipe_validates_with_recipe_machinery(recipe_file):
    r = load_probe_recipe(recipe_file)
    assert list(r.probe.tasks) == ["a", "b"] and r.probe.tasks["b"].split.eval_fraction == 0.25
    assert load_any(recipe_file).probe is not None  # `recipes validate/list` accept it
    with pytest.raises(RecipeError, match="is a probe recipe; run it with `finetune probe"):
        load_recipe(recipe_file)  # one return type: a training recipe or a one-line refusal
    with pytest.raises(RecipeError, match=r"unknown key `probe.tasks.a.dta`.*did you mean `probe.tasks.a.data`"):
        load_probe_recipe(recipe_file, ["probe.tasks.a.dta=1"])
    with pytest.raises(RecipeError, match=r"`probe.tasks.b.split.eval_fraction`.*must be < 1"):
        load_probe_recipe(recipe_file, ["probe.tasks.b.split.eval_fraction=1.5"])
    with pytest.raises(RecipeError, match=r"unknown key `probe.clasifier`.*did you mean `probe.classifier`"):
        load_probe_recipe(recipe_file, ["probe.clasifier.C=1"])
    with pytest.raises(RecipeError, match="no label column"):
        load_probe_recipe(recipe_file, ["probe.tasks.a.data.columns.label=null"])


def test_plans(recipe_file):
    r = load_probe_recipe(recipe_file)
    assert make_protocol(r, "sequential").stages == ["a", "b"]
    ret = make_protocol(r, "retention", cycles=3)
    assert ret.stages == ["a", "b"] * 3 and ret.probed == ["a", "b"]
    gen = make_protocol(r, "generalization", source="b")
    assert gen.stages == ["b"] and gen.probed == ["b", "a"]
    with pytest.raises(RecipeError, match="at least two tasks"):
        make_protocol(r, "sequential", tasks=["a"])
    with pytest.raises(RecipeError, match=r"unknown task `c`.*did you mean `a`|unknown task `c`"):
        make_protocol(r, "sequential", tasks=["a", "c"])


def test_summaries_against_hand_computed_values():
    plan = Protocol("sequential", ["a", "b", "c"], ["a", "b", "c"])
    m = [[.5, .5, .5], [.9, .6, .5], [.8, .9, .5], [.7, .7, .9]]
    s = probe_summary(plan.mode, plan.stages, plan.probed, m)
    assert s["degradation"] == pytest.approx({"a": .2, "b": .2, "c": 0.0})
    assert s["mean_degradation_earlier"] == pytest.approx(.2)
    ret = probe_summary("retention", ["a", "b", "a", "b"], ["a", "b"],
                        [[.5, .5], [.9, .5], [.7, .8], [.95, .6], [.6, .9]])
    assert ret["returns"][0] == {"stage": 2, "task": "a", "after_last_training": .9, "when_it_comes_back": .7,
                                 "after_retraining": .95}
    gen = probe_summary("generalization", ["a"], ["a", "b"], [[.5, .6], [.9, .55]])
    assert gen["delta_vs_pretrained"] == pytest.approx({"a": .4, "b": -.05})


def test_seeded_split_is_disjoint_and_reproducible(recipe_file, tmp_path):
    r = load_probe_recipe(recipe_file)
    m1 = materialize_task("b", r.probe.tasks["b"], tmp_path / "m1", 3, None)
    m2 = materialize_task("b", r.probe.tasks["b"], tmp_path / "m2", 3, None)
    tr = (tmp_path / "m1" / "train.jsonl").read_text()
    ev = (tmp_path / "m1" / "eval.jsonl").read_text()
    assert tr == (tmp_path / "m2" / "train.jsonl").read_text() and m1 == m2
    assert m1["train"] == 32 and m1["eval"] == 16 and m1["labels"] == ["negative", "positive"]
    assert not set(tr.splitlines()) & set(ev.splitlines())


# ---- the probe and the stages -----------------------------------------------------------------

def test_probe_never_changes_encoder_weights(recipe_file, tiny_model_dir, tmp_path):
    from finetune_cli.engine.inference import open_session
    from finetune_cli.models.text_model import HeadSpec

    r = load_probe_recipe(recipe_file)
    meta = materialize_task("a", r.probe.tasks["a"], tmp_path / "a", 3, None)
    sess = open_session(str(tiny_model_dir), device="cpu", heads=HeadSpec(pooling="mean", num_labels=0))
    model = sess.model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    acc = P.probe_model(sess, {"a": {**meta, "dir": str(tmp_path / "a")}}, r)
    assert 0.0 <= acc["a"] <= 1.0
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert not any(p.requires_grad for p in model.parameters())


def test_sequential_end_to_end_and_resume(recipe_file, tiny_model_dir, monkeypatch):
    load_probe_recipe(recipe_file)
    res = runner.invoke(app, ["probe", "sequential", "-r", str(recipe_file), "--json", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    out = Path(json.loads(res.stdout)["out_dir"])
    data = json.loads((out / "results.json").read_text())
    # schema
    assert set(data) >= {"mode", "stages", "tasks", "probe", "variants"}
    assert data["stages"] == ["pretrained", "a", "b"] and data["tasks"] == ["a", "b"]
    v = data["variants"]["ce"]
    assert set(v) >= {"objective", "runs", "matrix", "degradation", "mean_degradation_earlier"}
    m = np.asarray(v["matrix"])
    assert m.shape == (3, 2) and ((m >= 0) & (m <= 1)).all()
    assert (out / "accuracy.png").read_bytes()[:4] == b"\x89PNG" and "| ce | pretrained |" in (out / "results.md").read_text()
    # a stage changes the encoder, and it starts from the previous stage's encoder
    s0, s1 = Path(v["runs"][0]), Path(v["runs"][1])
    base, e0 = encoder_state(tiny_model_dir), encoder_state(s0 / "final")
    assert any(not torch.equal(base[k], e0[k]) for k in base)
    assert json.loads((s1 / "summary.json").read_text())["model"] == str(s0 / "final")
    assert not list(s0.glob("checkpoint-*")) and (s0 / "best").is_dir()  # finished stages drop resume state
    # resume: a rerun trains nothing and gives the same matrix
    def boom(*a, **k):
        raise AssertionError("a finished stage was trained again")

    monkeypatch.setattr(P, "run_train", boom)
    res2 = runner.invoke(app, ["probe", "sequential", "-r", str(recipe_file), "--json", "--device", "cpu"])
    assert res2.exit_code == 0, res2.output
    assert json.loads((out / "results.json").read_text())["variants"]["ce"]["matrix"] == v["matrix"]
    # an unfinished stage (probe file missing) runs again
    (out / "ce" / "probes" / "stage-01-b.json").unlink()
    calls = []
    monkeypatch.setattr(P, "run_train", lambda *a, **k: calls.append(a[0].recipe.output.name))
    res3 = runner.invoke(app, ["probe", "sequential", "-r", str(recipe_file), "--json", "--device", "cpu"])
    assert res3.exit_code == 0, res3.output
    assert calls == ["stage-01-b"]


def test_side_by_side_objectives_and_generalization(recipe_file, tmp_path):
    res = runner.invoke(app, ["probe", "generalization", "-r", str(recipe_file), "--source", "a", "--targets", "b",
                              "--objectives", "ce,ce:label_smoothing=0.2", "--json", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert list(data["variants"]) == ["ce", "ce:label_smoothing=0.2"]
    assert data["variants"]["ce:label_smoothing=0.2"]["objective"] == {"name": "ce", "label_smoothing": 0.2}
    for v in data["variants"].values():
        assert np.asarray(v["matrix"]).shape == (2, 2) and set(v["delta_vs_pretrained"]) == {"a", "b"}
    # the same pretrained encoder is probed for both variants
    assert data["variants"]["ce"]["matrix"][0] == data["variants"]["ce:label_smoothing=0.2"]["matrix"][0]


# ---- bad input ----------------------------------------------------------------------------------

def _error_line(res) -> str:
    lines = [x for x in res.output.strip().splitlines() if x.strip()]
    assert res.exit_code != 0 and len(lines) == 1, res.output
    return lines[0]


def test_cli_errors_are_one_line(recipe_file, tmp_path, tiny_model_dir, quickstart_data):
    assert "at least two tasks" in _error_line(runner.invoke(app, ["probe", "sequential", "-r", str(recipe_file), "--tasks", "a"]))
    assert "unknown task `zz`" in _error_line(runner.invoke(app, ["probe", "sequential", "-r", str(recipe_file), "--tasks", "a,zz"]))
    assert "unknown task `zz`" in _error_line(runner.invoke(app, ["probe", "generalization", "-r", str(recipe_file), "--source", "zz"]))
    assert "no label column" in _error_line(runner.invoke(
        app, ["probe", "sequential", "-r", str(recipe_file), "probe.tasks.b.data.columns.label=null"]))
    # a file that has no labels at all
    nolab = tmp_path / "nolabel.tsv"
    nolab.write_text("sentence\nhello there\nanother one\n")
    line = _error_line(runner.invoke(app, ["probe", "sequential", "-r", str(recipe_file), f"probe.tasks.b.data.train={nolab}"]))
    assert "task `b`" in line and "label" in line
    assert "objective" in _error_line(runner.invoke(app, ["probe", "sequential", "-r", str(recipe_file), "--objectives", "nope"]))
    assert "probe recipe" in _error_line(runner.invoke(app, ["train", "-r", str(recipe_file)]))


def test_shipped_probe_recipe_plans_four_glue_stages():
    r = load_probe_recipe("probe_sequential")
    assert make_protocol(r, "sequential").stages == ["sst2", "qnli", "qqp", "rte"]
    assert r.probe.tasks["qnli"].split.source == "eval" and r.probe.tasks["qqp"].split.source == "train"
