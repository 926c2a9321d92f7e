"""Training curves: the data behind ``figures/curves.png`` and ``finetune report --curves``."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from finetune_cli.cli.main import app
from finetune_cli.metrics.names import metric_names
from finetune_cli.rundir import RunDir
from finetune_cli.viz.curves import curve_series, mean_curve, multi_run_series

RECORDS = [
    {"step": 2, "epoch": 0.25, "lr": 1e-3, "loss": 0.9, "ce": 0.5, "scl": 0.4, "samples_per_s": 10.0},
    {"step": 4, "epoch": 0.5, "lr": 1e-3, "loss": 0.7, "ce": 0.4, "scl": 0.3, "samples_per_s": None,
     "gpu_mem_gb": 1.0, "gpu_mem_peak_gb": 2.0},
    {"step": 4, "epoch": 0.5, "eval/accuracy": 0.6, "eval/loss": 0.65},
    {"step": 6, "epoch": 0.75, "lr": 1e-3, "loss": float("nan"), "ce": 0.3, "scl": 0.2},
    {"step": 8, "epoch": 1.0, "eval/accuracy": 0.7, "eval/loss": 0.6},
]


def test_curve_series_panels_and_points():
    s = curve_series(RECORDS)
    assert list(s) == ["loss", "ce", "scl", "accuracy"]  # train parts first, then eval metrics
    assert s["loss"]["train"] == ([2, 4], [0.9, 0.7])  # NaN at step 6 skipped
    assert s["loss"]["eval"] == ([4, 8], [0.65, 0.6])  # eval/loss shares the loss panel
    assert s["ce"] == {"train": ([2, 4, 6], [0.5, 0.4, 0.3])}
    assert s["accuracy"] == {"eval": ([4, 8], [0.6, 0.7])}
    assert not {"lr", "epoch", "samples_per_s", "gpu_mem_gb", "gpu_mem_peak_gb"} & set(s)


def test_a_resumed_step_keeps_its_last_value():
    s = curve_series([{"step": 2, "loss": 1.0}, {"step": 2, "loss": 0.8}, {"step": 4, "loss": 0.5}])
    assert s["loss"]["train"] == ([2, 4], [0.8, 0.5])


def test_mean_curve_on_shared_steps():
    steps, vals = mean_curve([([2, 4, 6], [1.0, 2.0, 3.0]), ([2, 4], [3.0, 4.0])])
    assert steps == [2, 4] and vals == pytest.approx([2.0, 3.0])
    assert mean_curve([]) == ([], [])


def test_multi_run_series_groups_seeds():
    a1 = [{"step": 2, "loss": 1.0}, {"step": 2, "eval/accuracy": 0.5}, {"step": 4, "eval/accuracy": 0.7}]
    a2 = [{"step": 2, "loss": 3.0}, {"step": 2, "eval/accuracy": 0.7}, {"step": 4, "eval/accuracy": 0.9}]
    b1 = [{"step": 2, "loss": 2.0}, {"step": 4, "eval/accuracy": 0.6}]
    d = multi_run_series({"scl": [a1, a2], "ce": [b1]})
    assert list(d) == ["loss", "accuracy"]
    assert d["accuracy"]["scl"]["kind"] == "eval" and len(d["accuracy"]["scl"]["runs"]) == 2
    assert d["accuracy"]["scl"]["mean"][0] == [2, 4]
    assert d["accuracy"]["scl"]["mean"][1] == pytest.approx([0.6, 0.8])
    assert d["loss"]["scl"]["mean"] == ([2], [2.0]) and d["loss"]["ce"]["mean"] == ([2], [2.0])


def test_every_run_writes_curves_png_from_its_metrics(tiny_recipe):
    pytest.importorskip("matplotlib")
    from finetune_cli.pipelines.recipes import load_plan
    from finetune_cli.pipelines.train import run_train
    from finetune_cli.ui import UI

    out = run_train(load_plan(None, tiny_recipe("train.eval_every=4")), UI(quiet=True), device="cpu")
    png = out.run_dir / "figures" / "curves.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    s = curve_series(RunDir(out.run_dir).metrics.read())
    assert s["loss"]["train"][0] == [2, 4, 6, 8]  # log_every=2, 8 steps
    assert s["accuracy"]["eval"][0] == [4, 8]
    assert {"loss", "ce", "accuracy", "f1_macro", "mcc"} <= set(s)


def test_report_draws_curves_of_several_runs(tiny_recipe, tmp_path):
    pytest.importorskip("matplotlib")
    runner = CliRunner()
    res = runner.invoke(app, ["train", "-r", "quickstart", "--seeds", "1,2", "-q", *tiny_recipe("train.max_steps=4")])
    assert res.exit_code == 0, res.output
    root = tmp_path / "runs" / "tiny"
    png = tmp_path / "curves.png"
    res = runner.invoke(app, ["report", str(root), "--curves", str(png), "--no-plot", "--json"])
    assert res.exit_code == 0, res.output
    assert png.is_file() and json.loads(res.stdout)["curves"] == str(png)
    from finetune_cli.pipelines.report import build_report
    from finetune_cli.viz.report_curves import report_curves

    _, data = report_curves(build_report([str(root)]), tmp_path / "again.png")
    runs = data["loss"]["tiny"]["runs"]
    assert len(runs) == 2 and all(steps == [2, 4] for steps, _ in runs)
    mean = data["loss"]["tiny"]["mean"]
    assert mean[1] == pytest.approx([(runs[0][1][i] + runs[1][1][i]) / 2 for i in range(2)])


def _train_two_runs(tiny_recipe, tmp_path, *extra: str) -> list[str]:
    runner = CliRunner()
    for name, lr in (("x", "1e-3"), ("y", "5e-4")):
        res = runner.invoke(app, ["train", "-r", "quickstart", *tiny_recipe(f"output.name={name}", f"train.lr={lr}", *extra),
                                  "--device", "cpu", "-q"])
        assert res.exit_code == 0, res.output
    return [str(tmp_path / "runs" / "x"), str(tmp_path / "runs" / "y")]


def _report_figure(runs: list[str], tmp_path):
    """``finetune report RUNS --curves`` through the CLI, then the same data drawn into a Figure."""
    from finetune_cli.pipelines.report import build_report
    from finetune_cli.viz.curves import draw_multi_run
    from finetune_cli.viz.report_curves import report_curves

    res = CliRunner().invoke(app, ["report", *runs, "--curves", str(tmp_path / "curves.png"), "--no-plot"])
    assert res.exit_code == 0, res.output
    _, data = report_curves(build_report(runs), tmp_path / "again.png")
    fig = draw_multi_run(data)
    import matplotlib.pyplot as plt

    plt.close(fig)  # its axes stay readable
    return res, data, [ax for ax in fig.axes if ax.get_visible()]


def _marked(line) -> bool:
    return line.get_marker() not in (None, "", " ", "None")


def test_report_curves_draw_a_line_in_every_panel(tiny_recipe, tmp_path):
    pytest.importorskip("matplotlib")
    runs = _train_two_runs(tiny_recipe, tmp_path, "train.max_steps=8", "train.eval_every=2", "train.log_every=2")
    res, data, panels = _report_figure(runs, tmp_path)
    assert [ax.get_title() for ax in panels] == [f"{n} ({'eval' if n in metric_names('class') else 'train'})"
                                                 for n in data]
    assert {"loss", "ce", "accuracy", "f1_macro", "mcc"} <= set(data)
    for ax in panels:
        assert any(len(line.get_xdata()) >= 2 for line in ax.get_lines()), ax.get_title()
    assert "once" not in res.stderr


def test_runs_that_logged_each_metric_once_are_drawn_as_points_and_said_so(tiny_recipe, tmp_path):
    """The README's few-shot runs: 6 steps, log_every 10, eval_every 20, so every metric is logged
    once (at the last step). A one-point line draws nothing: the panels were empty."""
    pytest.importorskip("matplotlib")
    runs = _train_two_runs(tiny_recipe, tmp_path, "train.max_steps=4", "train.log_every=10", "train.eval_every=20")
    res, data, panels = _report_figure(runs, tmp_path)
    assert panels and all(steps == [4] for d in data.values() for g in d.values() for steps, _ in g["runs"])
    for ax in panels:
        lines = ax.get_lines()
        assert lines and all(_marked(line) for line in lines if len(line.get_xdata()) == 1), ax.get_title()
    assert f"--curves: every run logged loss, ce, {', '.join(metric_names('class'))} once" in res.stderr
