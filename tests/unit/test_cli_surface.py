"""What a user sees of the command itself: help text as written, ``-q``, ``--version``, and a
closed stdout pipe (``finetune ... | head -1``)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from finetune_cli.cli.literal_help import LiteralHelpCommand, LiteralHelpGroup, as_markup
from finetune_cli.cli.main import app
from finetune_cli.metrics.names import metric_names

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()

# ---- help text ---------------------------------------------------------------------------------

# Emoji and pictographs, dingbats, and the emoji presentation selector: what rich puts in for `:name:`.
EMOJI = re.compile("[\U0001f000-\U0001faff\u2600-\u27bf\u2b00-\u2bff\ufe0f]")


def _commands(cmd, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], object]]:
    yield path, cmd
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        yield from _commands(sub, (*path, name))


COMMANDS = dict(_commands(typer.main.get_command(app)))


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("path", list(COMMANDS), ids=lambda p: " ".join(p) or "finetune")
def test_help_shows_every_help_text_as_written(path):
    cmd = COMMANDS[path]
    assert isinstance(cmd, (LiteralHelpCommand, LiteralHelpGroup)), f"register {path} with cls=LiteralHelp*"
    res = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    shown = _flat(res.stdout)
    texts = [cmd.help or ""] + [p.help for p in cmd.params if getattr(p, "help", None)]
    # a group lists each subcommand with the first line of its help
    texts += [sub.help.splitlines()[0] for sub in getattr(cmd, "commands", {}).values() if sub.help]
    for text in texts:
        assert _flat(text.split("\f")[0].replace("``", "`")) in shown, text  # (docstring backticks: single)
    assert not EMOJI.search(res.stdout), EMOJI.findall(res.stdout)
    if path == ("sweep",):
        assert "uniform:A:B, loguniform:A:B, int:A:B" in shown


def test_help_markup_renders_any_text_literally_and_leaves_the_help_strings_alone():
    from rich.text import Text

    hostile = "SPEC: uniform:A:B, [bold]x[/bold] \\[y] :smile: :a-emoji: C:\\x: [/] [link=u]z"
    assert Text.from_markup(as_markup(hostile)).plain == hostile
    cmd = COMMANDS[("sweep",)]
    before = [p.help for p in cmd.params]
    with typer.Context(cmd, info_name="sweep") as ctx:
        cmd.get_help(ctx)
    assert [p.help for p in cmd.params] == before  # escaped only while formatting


# ---- -q ----------------------------------------------------------------------------------------


class Ctx:
    """What the -q cases are built from: the tiny recipe, the quickstart data, one trained run."""

    def __init__(self, tmp_path: Path, tiny_recipe: Callable, quickstart_data: dict, tiny_model_dir: Path):
        self.tmp, self.recipe, self.data, self.model = tmp_path, tiny_recipe, quickstart_data, tiny_model_dir
        self._run: Path | None = None

    def run(self) -> str:
        if self._run is None:
            res = runner.invoke(app, ["train", "-r", "quickstart", *self.recipe("output.name=trained", "train.max_steps=4"),
                                      "--device", "cpu", "-q", "--json"])
            assert res.exit_code == 0, res.output
            self._run = Path(json.loads(res.stdout)["run_dir"])
        return str(self._run)

    def probe_recipe(self) -> str:
        from tests.unit.test_probe import probe_yaml

        return str(probe_yaml(self.tmp, self.model, self.data))


# Every command with -q, run three times: -q (nothing at all), -q --json (the document only), and
# plainly (it does print something, or the -q check would prove nothing).
QUIET_CASES: dict[tuple[str, ...], Callable[[Ctx], list[str]]] = {
    ("train",): lambda c: ["-r", "quickstart", *c.recipe("train.max_steps=4"), "--device", "cpu"],
    ("eval",): lambda c: [c.run(), "--device", "cpu"],
    ("predict",): lambda c: [c.run(), "-i", c.data["eval"], "-o", str(c.tmp / "pred.csv"), "-c", "sentence",
                             "--device", "cpu"],
    ("embed",): lambda c: [c.run(), c.data["eval"], "-o", str(c.tmp / "emb.npy"), "-c", "sentence",
                           "--device", "cpu"],
    ("export",): lambda c: [c.run(), "--format", "onnx", "-o", str(c.tmp / "onnx"), "--overwrite"],
    ("augment",): lambda c: ["-i", c.data["train"], "-o", str(c.tmp / "noisy.tsv"), "--delete-words", "0.2",
                             "--overwrite"],
    ("sweep",): lambda c: ["-r", "quickstart", *c.recipe("train.max_steps=2"), "--param", "train.lr=choice:1e-3,2e-3",
                           "--trials", "1", "--seeds", "1", "--out", str(c.tmp / "sw"), "--no-baseline",
                           "--device", "cpu"],
    ("push",): lambda c: [c.run(), "me/tiny", "--dry-run"],
    ("probe", "sequential"): lambda c: ["-r", c.probe_recipe(), "--device", "cpu"],
    ("probe", "generalization"): lambda c: ["-r", c.probe_recipe(), "--source", "a", "--targets", "b",
                                            "--device", "cpu"],
    ("probe", "retention"): lambda c: ["-r", c.probe_recipe(), "--cycles", "1", "--device", "cpu"],
}


def test_every_command_with_quiet_has_a_case():
    with_quiet = {path for path, cmd in COMMANDS.items()
                  if any("--quiet" in getattr(p, "opts", ()) for p in getattr(cmd, "params", ()))}
    assert with_quiet == set(QUIET_CASES)


@pytest.mark.parametrize("path", list(QUIET_CASES), ids=" ".join)
def test_quiet_prints_nothing_but_the_json_document(path, tmp_path, tiny_recipe, quickstart_data, tiny_model_dir):
    if path == ("sweep",):
        pytest.importorskip("optuna")
    args = [*path, *QUIET_CASES[path](Ctx(tmp_path, tiny_recipe, quickstart_data, tiny_model_dir))]
    quiet = runner.invoke(app, [*args, "-q"])
    assert quiet.exit_code == 0, quiet.output
    assert quiet.stderr == "" and quiet.stdout == "", quiet.output
    as_json = runner.invoke(app, [*args, "-q", "--json"])
    assert as_json.exit_code == 0 and as_json.stderr == "", as_json.output
    assert isinstance(json.loads(as_json.stdout), (dict, list))
    loud = runner.invoke(app, args)
    assert loud.exit_code == 0 and loud.stderr.strip(), loud.output


def test_quiet_train_and_eval_in_a_real_process(tiny_recipe, tmp_path):
    """The same through the installed entry point: no table, no progress, no log on stderr."""
    env = _env()
    train = _finetune(["train", "-r", "quickstart", *tiny_recipe("train.max_steps=4"), "--device", "cpu", "-q"], env)
    assert train.returncode == 0 and train.stderr == "" and train.stdout == "", train.stderr
    ev = _finetune(["eval", str(tmp_path / "runs" / "tiny"), "--device", "cpu", "-q", "--json"], env)
    assert ev.returncode == 0 and ev.stderr == "", ev.stderr
    assert set(json.loads(ev.stdout)["metrics"]) == set(metric_names("class"))


# ---- a real process: --version, a closed pipe ---------------------------------------------------


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def _finetune_cmd() -> str:
    """The venv's ``finetune`` script (this checkout first on PYTHONPATH), else ``python -m finetune_cli``."""
    script = shutil.which("finetune", path=str(Path(sys.executable).parent))
    return script or f"{sys.executable} -m finetune_cli"


def _finetune(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([*_finetune_cmd().split(), *args], env=env, capture_output=True, text=True, timeout=300)


def test_version_is_the_installed_one():
    from importlib.metadata import version

    import finetune_cli

    assert finetune_cli.__version__ == version("finetune-cli")
    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.stdout == f"finetune {finetune_cli.__version__}\n", res.output


def test_the_installed_version_is_pyprojects():
    """Holds once this checkout is installed (``make`` reinstalls when pyproject.toml changes)."""
    import tomllib
    from importlib.metadata import distribution

    dist = distribution("finetune-cli")
    url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
    if url.rstrip("/") != REPO.as_uri():
        pytest.skip(f"finetune-cli is installed from {url or 'an archive'}, not from this checkout")
    assert dist.version == tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


@pytest.mark.parametrize("pipeline, quiet_stderr", [
    ("{finetune} train --help | head -1", True),
    ("{finetune} recipes list | head -1", False),  # its table is human output: stderr
    ("{finetune} recipes list --json | head -1", True),
    ("{finetune} recipes show quickstart | true", True),  # the reader is gone before the first write
])
def test_a_closed_stdout_pipe_ends_quietly_with_0(pipeline, quiet_stderr):
    cmd = "set -o pipefail; " + pipeline.format(finetune=_finetune_cmd())
    res = subprocess.run(["bash", "-c", cmd], env=_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr and "error" not in res.stderr, res.stderr
    assert res.stderr == "" if quiet_stderr else "packaged recipes" in res.stderr, res.stderr
