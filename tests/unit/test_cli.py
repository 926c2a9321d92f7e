"""The command line: help, a run and its files, eval, and one-line errors for bad input."""

from __future__ import annotations

import json

import pytest

from finetune_cli.metrics.names import metric_names
from tests.unit._cli import invoke


def error_line(res) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines, res.output
    return lines[-1]


SUBCOMMANDS = ("train", "eval", "embed", "augment", "probe", "report", "recipes")


def test_help_lists_every_subcommand():
    res = invoke("--help")
    assert res.exit_code == 0
    listed = {ln.split()[1] for ln in res.stdout.splitlines() if ln.startswith("│ ") and len(ln.split()) > 2}
    assert set(SUBCOMMANDS) <= listed, listed


@pytest.mark.parametrize("cmd", SUBCOMMANDS)
def test_every_subcommand_has_help(cmd):
    res = invoke(cmd, "--help")
    assert res.exit_code == 0 and "Usage:" in res.stdout and f"finetune {cmd}" in res.stdout, res.output


def test_recipes_list_show_validate():
    res = invoke("recipes", "list", "--json")
    assert res.exit_code == 0
    names = {r["name"] for r in json.loads(res.stdout)}
    assert {"quickstart", "ce"} <= names
    assert "objective:" in invoke("recipes", "show", "quickstart").stdout
    res = invoke("recipes", "validate", "quickstart", "train.lr=1e-4", "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["train"]["lr"] == 1e-4


def test_recipes_list_descriptions_end_at_a_sentence():
    """Each packaged recipe's description is the first sentence of its header, whole: it ends with a
    period and is where the header's prose starts, over a line break where the sentence has one."""
    from finetune_cli.recipe import PACKAGED_RECIPES

    res = invoke("recipes", "list", "--json")
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r["description"] for r in json.loads(res.stdout)}
    assert len(rows) == len(list(PACKAGED_RECIPES.rglob("*.yaml")))
    for name, text in rows.items():
        header = " ".join(ln[1:].strip() for ln in (PACKAGED_RECIPES / f"{name}.yaml").read_text().splitlines()
                          if ln.startswith("# "))
        assert text.endswith(".") and header.startswith(text) and len(text) > 20, (name, text)
    assert rows["fewshot/fastfit"].endswith("prediction by similarity to the label texts.")  # its second line
    assert rows["fewshot/ce"].startswith("Few-shot CE (e.g. 20 examples per class): a budget")  # not cut at "e.g."


def test_recipe_description_rule():
    from finetune_cli.cli.recipes import description

    header = ("# Few-shot CE (e.g. 20 a class, Gunel et al., ICLR 2021) on a\n# schedule of steps. Its second "
              "sentence.\n#   finetune train -r x\nmodel: {}\n")
    assert description(header) == "Few-shot CE (e.g. 20 a class, Gunel et al., ICLR 2021) on a schedule of steps."
    assert description("# No period, then a command\n#   finetune train -r x\n") == "No period, then a command"
    assert description("model: {}\n") == ""


def test_train_then_eval(tiny_recipe, tmp_path):
    res = invoke("train", "--recipe", "quickstart", *tiny_recipe(), "--device", "cpu", "--json", "-q")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    run = tmp_path / "runs" / "tiny"
    assert summary["run_dir"] == str(run) and (run / "final" / "config.json").is_file()
    assert "model:" in (run / "recipe.yaml").read_text()
    res = invoke("eval", str(run), "--json", "-q")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert set(out["metrics"]) == set(metric_names("class")) and out["examples"] == 100
    assert out["model"] == str(run / "best")
    # evaluation of the best checkpoint reproduces the accuracy recorded during training
    assert out["metrics"]["accuracy"] == pytest.approx(summary["best_metric"])


def test_train_refuses_a_different_run_unless_overwrite(tiny_recipe):
    assert invoke("train", "-r", "quickstart", *tiny_recipe(), "-q").exit_code == 0
    res = invoke("train", "-r", "quickstart", *tiny_recipe("train.lr=5e-4"), "-q")
    assert res.exit_code == 2
    assert "holds a different run (train.lr: 0.001 there, 0.0005 now); pass --overwrite" in error_line(res)
    res = invoke("train", "-r", "quickstart", *tiny_recipe("train.lr=5e-4"), "-q", "--overwrite")
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("case, args, message", [
    ("missing recipe", ["-r", "no/such.yaml"], "recipe file not found: no/such.yaml"),
    ("unknown key", ["-r", "quickstart", "train.epochz=1"], "unknown key `train.epochz` in quickstart; did you mean `train.epochs`?"),
    ("wrong type", ["-r", "quickstart", "train.epochs=many"], "`train.epochs` in quickstart must be a number, got 'many'"),
    ("unknown objective", ["-r", "quickstart", "objective.name=sclx"], "unknown objective `sclx`"),
    ("missing data", ["-r", "quickstart", "data.train=nope.tsv"], "data file not found: nope.tsv"),
    ("missing column", ["-r", "quickstart", "data.columns.text=txt"], "missing column `txt` in pkg:quickstart/train.tsv"),
    ("model path", ["-r", "quickstart", "model.name=./no/such/model"], "model path does not exist: ./no/such/model"),
])
def test_bad_input_gives_one_line_error(tmp_path, case, args, message):
    res = invoke("train", *args, f"output.dir={tmp_path}", "-q")
    assert res.exit_code == 2, res.output
    assert message in error_line(res)
    assert "Traceback" not in res.output
    assert not any(tmp_path.rglob("checkpoint-*"))


def test_malformed_yaml_and_empty_data(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: {lr: 1\n")
    res = invoke("train", "-r", str(bad))
    assert res.exit_code == 2 and f"malformed YAML in {bad}:" in error_line(res)
    empty = tmp_path / "empty.tsv"
    empty.write_text("sentence\tlabel\n")
    res = invoke("train", "-r", "quickstart", f"data.train={empty}", f"output.dir={tmp_path}", "-q")
    assert res.exit_code == 2 and "is empty" in error_line(res)


def test_eval_unseen_labels_and_missing_model(tiny_recipe, tmp_path):
    assert invoke("train", "-r", "quickstart", *tiny_recipe(), "-q").exit_code == 0
    ev = tmp_path / "ev.tsv"
    ev.write_text("sentence\tlabel\nfine\tneutral\n")
    res = invoke("eval", str(tmp_path / "runs" / "tiny"), f"data.eval={ev}", "-q")
    assert res.exit_code == 2
    assert "label `neutral` in row 2 of" in error_line(res) and "never seen in training" in error_line(res)
    res = invoke("eval", str(tmp_path / "nothing-here"), "data.eval=x.tsv")
    assert res.exit_code == 2 and "model path does not exist" in error_line(res)


def test_predict_on_an_embedding_model_suggests_an_embed_command_that_runs(tiny_model_dir, tmp_path):
    """The hint names `finetune embed MODEL FILE --output ...`, and that command, as written, works."""
    import re
    import shlex

    src = tmp_path / "s.txt"
    src.write_text("a sentence\nanother one\n")
    res = invoke("predict", str(tiny_model_dir), "--input", str(src), "--output", str(tmp_path / "p.csv"))
    line = error_line(res)
    assert res.exit_code != 0 and "embedding model" in line, line
    hint = re.search(r"`finetune (embed [^`]+)`", line).group(1)
    args = [str(src) if a == "FILE" else str(tmp_path / "e.npy") if a == "OUT.npy" else a for a in shlex.split(hint)]
    res = invoke(*args, "--device", "cpu")
    assert res.exit_code == 0, res.output
    assert (tmp_path / "e.npy").is_file()
