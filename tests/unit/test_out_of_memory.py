"""Running out of device memory is one line naming the batch size and exit 3, not an "unexpected
internal error" (simulated here with the exception torch raises; the GPU tier provokes a real one)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.unit._cli import invoke, one_error_line


@pytest.mark.parametrize("graphs", ["off", "on"])
def test_out_of_memory_at_a_training_step(tiny_recipe, tmp_path, monkeypatch, graphs):
    """With the step captured (a GPU stood in for: the CPU runs the graphs' static-buffer step) the
    line also names train.cuda_graphs=off, which frees the gradients between steps."""
    from finetune_cli.engine import step as step_mod
    from finetune_cli.objectives.ce import CrossEntropy

    monkeypatch.setattr(step_mod, "device_can_capture", lambda device: True)

    calls = {"n": 0}
    orig = CrossEntropy.forward

    def oom_at_step_3(self, model, batch):
        calls["n"] += 1
        if calls["n"] == 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.50 GiB ...")
        return orig(self, model, batch)

    monkeypatch.setattr(CrossEntropy, "forward", oom_at_step_3)
    res = invoke("train", "-r", "quickstart", *tiny_recipe("train.save_every=1", f"train.cuda_graphs={graphs}"),
                 "--device", "cpu", "-q")
    assert res.exit_code == 3
    line = one_error_line(res)
    assert line.startswith("error: out of memory on cpu") and "at step 3 with train.batch_size=8" in line, line
    assert "train.grad_accum" in line and "Traceback" not in res.output
    assert ("train.cuda_graphs=off" in line) == (graphs == "on") and \
        ("gradient_checkpointing" in line) == (graphs == "off")
    run = tmp_path / "runs" / "tiny"
    assert (run / "checkpoint-2").is_dir() and not (run / "summary.json").exists()  # nothing lost


def test_out_of_memory_in_an_evaluation_names_the_evaluation(tiny_recipe, tmp_path, monkeypatch):
    """The evaluation has its own batch size: its out-of-memory line names it, not the next step."""
    import finetune_cli.engine.evaluation as evaluation

    def oom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory.")

    monkeypatch.setattr(evaluation, "forward_all", oom)
    res = invoke("train", "-r", "quickstart", *tiny_recipe("train.eval_every=2", "train.save_every=1",
                                                          "train.eval_batch_size=64"), "--device", "cpu", "-q")
    assert res.exit_code == 3
    line = one_error_line(res)
    assert line.startswith("error: out of memory on cpu"), line
    assert "in the evaluation after step 2 with train.eval_batch_size=64:" in line, line
    assert "lower train.eval_batch_size" in line and "train.batch_size" not in line.replace("eval_batch_size", "")
    assert (tmp_path / "runs" / "tiny" / "checkpoint-1").is_dir()  # the last checkpoint stays


def test_out_of_memory_in_predict(tiny_recipe, tmp_path, monkeypatch, quickstart_data):
    assert invoke("train", "-r", "quickstart", *tiny_recipe("train.max_steps=2"), "--device", "cpu", "-q").exit_code == 0
    import finetune_cli.engine.inference as inference

    def oom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory.")

    monkeypatch.setattr(inference, "forward_all", oom)
    out = tmp_path / "p.jsonl"
    res = invoke("predict", tmp_path / "runs" / "tiny", "-i", quickstart_data["eval"], "-o", out, "-c", "sentence",
                 "--batch-size", "512", "--device", "cpu", "-q")
    assert res.exit_code == 3
    line = one_error_line(res)
    assert line.startswith("error: out of memory on cpu at --batch-size 512") and "lower --batch-size" in line, line
    assert not out.exists() and not list(tmp_path.glob("p.jsonl*"))
    assert json.loads((tmp_path / "runs" / "tiny" / "summary.json").read_text())["steps"] == 2
