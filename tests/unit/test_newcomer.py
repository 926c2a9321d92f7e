"""What a new user met on the README's paths: run names, failed starts, late validation,
misleading messages, eval files, --seeds nesting, JSON output, table widths."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from finetune_cli.errors import RecipeError
from finetune_cli.pipelines.recipes import load_recipe
from tests.unit._cli import invoke, one_error_line


@pytest.mark.parametrize("given", ["r3f", "r3f.yaml", "recipes/r3f.yaml"])
def test_a_recipe_given_by_name_names_its_run(given, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    assert load_recipe(given).run_dir == Path("runs/r3f")
    assert load_recipe(None).run_dir == Path("runs/run")  # defaults alone: nothing to name it after


def test_a_failed_start_does_not_block_the_fixed_command(tiny_recipe, tmp_path):
    bad = invoke("train", "-r", "quickstart", *tiny_recipe("train.max_steps=2"), "--device", "cuda:7", "-q")
    assert bad.exit_code == 2 and "cuda:7" in one_error_line(bad)
    run = tmp_path / "runs" / "tiny"
    assert not run.exists()  # a start refused before training leaves no run folder behind
    # the fixed command differs from the failed one (another lr), and nothing was trained: it runs
    ok = invoke("train", "-r", "quickstart", *tiny_recipe("train.max_steps=2", "train.lr=5e-4"), "--device", "cpu",
                "-q", "--json")
    assert ok.exit_code == 0, ok.output and json.loads(ok.stdout)["steps"] == 2


@pytest.mark.parametrize("override, message", [
    ("train.lr=1e999", "`train.lr`.*finite"),
    ("train.epochs=.inf", "`train.epochs`.*finite"),
    ("train.seed=18446744073709551616", "`train.seed`.*<= 9223372036854775807"),
    ("train.seed=-1", "`train.seed`.*>= 0"),
    ("train.metric=acc", "`train.metric`.*did you mean `accuracy`"),
])
def test_values_refused_at_validation(override, message):
    with pytest.raises(RecipeError, match=message):
        load_recipe("quickstart", [override])


def test_data_errors_are_not_preceded_by_the_whole_recipe(tiny_recipe, tmp_path):
    res = invoke("train", "-r", "quickstart", *tiny_recipe("data.columns.text=nosuch"), "--device", "cpu")
    assert res.exit_code == 2
    assert "nosuch" in one_error_line(res) and "model:" not in res.stderr


def test_missing_local_paths_are_called_missing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    res = invoke("embed", "runs/simcse_unsup", "s.txt", "-o", "e.npy")
    (tmp_path / "s.txt").write_text("a sentence\n")
    res = invoke("embed", "runs/simcse_unsup", "s.txt", "-o", "e.npy")
    assert res.exit_code == 2 and "does not exist: runs/simcse_unsup" in one_error_line(res)
    res = invoke("eval", "runs/missing")
    assert res.exit_code == 2 and "does not exist: runs/missing" in one_error_line(res)


def test_messages_name_the_real_problem(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("bad.jsonl").write_text('{"text": "a", "label": "x"}\n{"text": "b", "label": "y"}\n{"text": oops}\n')
    res = invoke("embed", "embedded", "bad.jsonl", "-o", "e.npy")
    assert res.exit_code == 2 and "at line 3" in one_error_line(res)
    Path("in.tsv").write_text("sentence\tlabel\nfine day\tpos\n")
    res = invoke("augment", "--delete-one-word", "-i", "in.tsv", "-o", "n.xlsx")
    line = one_error_line(res)
    assert res.exit_code == 2 and ".xlsx" in line and "data.format" not in line and ".tsv" in line
    res = invoke("recipes", "show", "nosuch")
    line = one_error_line(res)
    assert res.exit_code == 2 and "did you mean" not in line and "packaged recipes: ce, core_tuning" in line


def test_a_utf8_bom_is_not_part_of_the_first_column(tmp_path):
    from finetune_cli.data.sources import read_file

    f = tmp_path / "bom.tsv"
    f.write_bytes("\ufeffsentence\tlabel\nhello\tpos\n".encode())
    assert read_file(str(f), {"text": "sentence", "label": "label"}).columns["text"] == ["hello"]


def test_json_output_has_no_bare_nan(monkeypatch, capsys):
    from finetune_cli.cli.common import _emit_json as emit_json

    emit_json({"a": math.nan, "b": [1.0, math.inf], "c": {"d": -math.inf}})
    assert json.loads(capsys.readouterr().out) == {"a": None, "b": [1.0, None], "c": {"d": None}}


def test_tables_are_not_cut_when_not_a_terminal():
    res = invoke("recipes", "list")
    assert res.exit_code == 0
    assert "Quickstart: CE on the packaged MiniLM and the shipped 300-review sentiment set" in res.stderr + res.stdout


def test_evaluating_other_data_keeps_the_runs_own_eval_json(tiny_recipe, tmp_path, quickstart_data):
    res = invoke("train", "-r", "quickstart", *tiny_recipe("train.max_steps=2"), "--device", "cpu", "-q")
    assert res.exit_code == 0, res.output
    run = tmp_path / "runs" / "tiny"
    assert invoke("eval", run, "-q", "--no-figures").exit_code == 0
    own = (run / "eval.json").read_text()
    other = tmp_path / "other.yaml"
    other.write_text(f"# other data\ndata: {{eval: '{quickstart_data['train']}', columns: {{text: sentence}}}}\n"
                     "train: {eval_batch_size: 64}\n")
    res = invoke("eval", run, "-r", other, "-q", "--no-figures", "--json")
    assert res.exit_code == 0, res.output
    assert (run / "eval.json").read_text() == own
    assert json.loads((run / "eval-other.json").read_text())["examples"] == 300


def test_seeds_refuse_to_nest_inside_a_single_run(tiny_recipe, tmp_path):
    assert invoke("train", "-r", "quickstart", *tiny_recipe("train.max_steps=2"), "--device", "cpu", "-q").exit_code == 0
    res = invoke("train", "-r", "quickstart", *tiny_recipe("train.max_steps=2"), "--device", "cpu", "--seeds", "1,2")
    assert res.exit_code == 2 and "holds a single run" in one_error_line(res)
    assert not list((tmp_path / "runs" / "tiny").glob("seed-*"))


def test_an_unreachable_hub_fails_fast(monkeypatch):
    """No 50 s of retries: one quick connection attempt, refused here, then a one-line error."""
    import socket
    import time

    from finetune_cli.errors import ModelError
    from finetune_cli.models.loading import resolve_model

    tries = []

    def refuse(addr, timeout=None):
        tries.append((addr, timeout))
        raise OSError(-2, "Name or service not known")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(socket, "create_connection", refuse)
    t0 = time.perf_counter()
    with pytest.raises(ModelError, match=r"cannot be reached: Name or service not known"):
        resolve_model("someorg/some-model")
    assert time.perf_counter() - t0 < 2 and len(tries) == 1 and tries[0][1] <= 5
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # offline: no attempt at all, the loader's cache message
    assert resolve_model("someorg/some-model") == ("someorg/some-model", False) and len(tries) == 1


def test_data_paths_resolve_against_the_data_dir(tmp_path, monkeypatch):
    """`data:` paths follow --data-dir (exported for the run), from any working directory."""
    from finetune_cli.data.sources import resolve_path
    from finetune_cli.data.tasks import data_dir_from_env
    from finetune_cli.errors import DataError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match="pass --data-dir"):
        resolve_path("data:STS-B/dev.tsv")
    (tmp_path / "d" / "STS-B").mkdir(parents=True)
    data_dir_from_env(str(tmp_path / "d"))
    assert resolve_path("data:STS-B/dev.tsv") == tmp_path / "d" / "STS-B" / "dev.tsv"
    assert resolve_path("rel/x.tsv") == Path("rel/x.tsv")  # plain relative paths: the current directory
    assert load_recipe("simcse_unsup").data.train.startswith("data:")


def test_every_extra_the_docs_install_exists():
    """`pip install -e ".[bench]"` in the README failed: the extra was never defined."""
    import re
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    root = Path(__file__).resolve().parents[2]
    extras = set(tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    named = set()
    for doc in [root / "README.md", *(root / "docs").glob("*.md"), *(root / "experiments").glob("*.py")]:
        for group in re.findall(r'\.\[([A-Za-z0-9_,-]+)\]"', doc.read_text(encoding="utf-8")):
            named.update(group.split(","))
    assert named and named <= extras, f"extras named in the docs but not in pyproject.toml: {named - extras}"
