"""Experiment trackers through accelerate (TensorBoard and MLflow read back from local files),
device-aware progress fields, and the recipe check for a missing tracker package."""

from __future__ import annotations

import json
import math

import pytest
import torch

from finetune_cli.engine import device_info, tracking
from finetune_cli.pipelines.recipes import load_plan, load_recipe
from finetune_cli.pipelines.train import run_train
from finetune_cli.recipe import RecipeError
from finetune_cli.ui import UI


def _train(overrides):
    return run_train(load_plan(None, overrides), UI(quiet=True), device="cpu")


def _records(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]


def test_flatten_gives_hparam_values():
    flat = tracking.flatten({"train": {"lr": 1e-3, "report_to": ["tensorboard"], "max_steps": None},
                             "objective": {"name": "scl", "tau": 0.3}, "data": {"columns": {"text": "s"}}})
    assert flat == {"train.lr": 1e-3, "train.report_to": '["tensorboard"]', "train.max_steps": "null",
                    "objective.name": "scl", "objective.tau": 0.3, "data.columns.text": "s"}
    assert tracking.loggable({"step": 3, "loss": 0.5, "samples_per_s": None, "flag": True, "epoch": 0.5}) == {
        "loss": 0.5, "epoch": 0.5}


def test_tensorboard_round_trip(tiny_recipe):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = _train(tiny_recipe("train.eval_every=4", "train.report_to=[tensorboard]"))
    recs = _records(out.run_dir)
    events = list((out.run_dir / "tracking").rglob("events.out.tfevents.*"))
    assert events, "no TensorBoard event file"
    scalars: dict[str, dict[int, float]] = {}
    for ev in events:
        acc = EventAccumulator(str(ev.parent))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            scalars.setdefault(tag, {}).update({e.step: e.value for e in acc.Scalars(tag)})
    train = [r for r in recs if "loss" in r]
    evals = [r for r in recs if "eval/accuracy" in r]
    assert len(train) == 4 and len(evals) == 2  # log_every=2 over 8 steps; eval at 4 and 8
    for r in train:
        for k in ("loss", "ce", "lr", "samples_per_s"):
            assert scalars[k][r["step"]] == pytest.approx(r[k], rel=1e-6), (k, r["step"])
    for r in evals:
        assert scalars["eval/accuracy"][r["step"]] == pytest.approx(r["eval/accuracy"], rel=1e-6)
    # the resolved recipe went in as hyper-parameters
    hparams = list((out.run_dir / "tracking").rglob("hparams.yml"))
    assert hparams and "train.lr: 0.001" in hparams[0].read_text()


def test_mlflow_round_trip(tiny_recipe, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = _train(tiny_recipe("train.eval_every=4", "train.report_to=[mlflow]"))
    track = out.run_dir / "tracking"
    run_id = (track / "mlflow_run_id").read_text().strip()
    client = MlflowClient(f"sqlite:///{(track / 'mlflow.db').resolve()}")
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["train.lr"] == "0.001" and run.data.params["objective.name"] == "ce"
    recs = _records(out.run_dir)
    for key in ("loss", "eval/accuracy", "lr"):
        logged = {m.step: m.value for m in client.get_metric_history(run_id, key)}
        expected = {r["step"]: r[key] for r in recs if key in r}
        assert logged.keys() == expected.keys(), key
        for step, v in expected.items():
            assert logged[step] == pytest.approx(v, rel=1e-6)


def test_fingerprint_ignores_report_to(tiny_recipe):
    a = load_recipe(None, tiny_recipe())
    b = load_recipe(None, tiny_recipe("train.report_to=[tensorboard]")) if _has("tensorboard") else a
    assert a.fingerprint() == b.fingerprint()


def _has(mod):
    import importlib.util

    return importlib.util.find_spec(mod) is not None


def test_missing_tracker_package_is_a_one_line_recipe_error(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(RecipeError) as e:
        load_recipe(None, ["train.report_to=[wandb]"])
    msg = str(e.value)
    assert "\n" not in msg and "pip install 'finetune-cli[wandb]'" in msg and "train.report_to" in msg
    with pytest.raises(RecipeError, match="unknown tracker 'tensorbord'.*did you mean `tensorboard`"):
        load_recipe(None, ["train.report_to=[tensorbord]"])
    with pytest.raises(RecipeError, match="must be a list"):
        load_recipe(None, ["train.report_to=7"])


def test_cli_rejects_missing_tracker_before_loading_a_model(tiny_recipe, monkeypatch):
    import importlib.util

    from typer.testing import CliRunner

    from finetune_cli.cli.main import app

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    res = CliRunner().invoke(app, ["train", "-r", "quickstart", *tiny_recipe("train.report_to=[mlflow]")])
    assert res.exit_code == 2
    assert "pip install 'finetune-cli[mlflow]'" in res.output
    assert not any((p / "recipe.yaml").exists() for p in [load_recipe(None, tiny_recipe()).run_dir])


# ---- device-aware progress -------------------------------------------------------------------

def test_cpu_device_description_and_no_gpu_fields(tiny_recipe):
    assert device_info.describe(torch.device("cpu")) == f"cpu ×{torch.get_num_threads()} threads"
    assert device_info.memory(torch.device("cpu")) is None
    out = _train(tiny_recipe())
    recs = _records(out.run_dir)
    assert recs and not any("gpu_mem_gb" in r for r in recs)
    s = json.loads((out.run_dir / "summary.json").read_text())
    assert s["device_name"].startswith("cpu ×") and s["gpu_mem_peak_gb"] is None


def test_faked_cuda_memory_query(monkeypatch):
    """The CUDA branch of the helpers, with torch.cuda's queries faked (no GPU needed)."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda idx=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda dev=None: 3 * 2**29)  # 1.5 GiB
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda dev=None: 5 * 2**30)
    dev = torch.device("cuda:0")
    assert device_info.describe(dev) == "cuda:0 NVIDIA H100 80GB HBM3"
    mem = device_info.memory(dev)
    assert mem == {"gpu_mem_gb": 1.5, "gpu_mem_peak_gb": 5.0}
    assert device_info.memory_text(mem) == "mem 1.50/5.00 GB"


def test_gpu_memory_fields_reach_metrics_summary_and_progress(tiny_recipe, monkeypatch):
    """A run whose memory query is faked as CUDA's writes the fields where the issue says."""
    calls = {"n": 0}

    def fake_memory(device):
        calls["n"] += 1
        return {"gpu_mem_gb": 0.25 * calls["n"], "gpu_mem_peak_gb": 2.0}

    monkeypatch.setattr(device_info, "memory", fake_memory)
    monkeypatch.setattr(device_info, "describe", lambda device: "cuda:0 NVIDIA Fake")
    lines = []

    class Capture(UI):
        def log(self, msg):
            lines.append(msg)

    ui = Capture()
    ui.plain = True  # plain log lines (what CI sees) carry the same fields as the bar
    out = run_train(load_plan(None, tiny_recipe()), ui, device="cpu")
    train_recs = [r for r in _records(out.run_dir) if "loss" in r]
    assert train_recs and all(r["gpu_mem_peak_gb"] == 2.0 for r in train_recs)
    assert [r["gpu_mem_gb"] for r in train_recs] == [0.25 * (i + 1) for i in range(len(train_recs))]
    s = json.loads((out.run_dir / "summary.json").read_text())
    assert s["device_name"] == "cuda:0 NVIDIA Fake" and s["gpu_mem_peak_gb"] == 2.0
    assert any(ln.startswith("train · cuda:0 NVIDIA Fake 2/8") and "mem 0.25/2.00 GB" in ln for ln in lines), lines
    assert any("training on cuda:0 NVIDIA Fake" in ln for ln in lines)
    assert not any(isinstance(v, float) and math.isnan(v) for r in train_recs for v in r.values())
