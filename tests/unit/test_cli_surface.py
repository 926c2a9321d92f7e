"""What a user sees of the command itself: help text as written, and a closed stdout pipe
(``finetune ... | head -1``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from finetune_cli.cli.literal_help import LiteralHelpCommand, LiteralHelpGroup, as_markup
from finetune_cli.cli.main import app

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
        assert _flat(text.split("\f")[0]) in shown, text
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


# ---- a real process: a closed pipe --------------------------------------------------------------


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def _finetune_cmd() -> str:
    """The venv's ``finetune`` script (this checkout first on PYTHONPATH), else ``python -m finetune_cli``."""
    script = shutil.which("finetune", path=str(Path(sys.executable).parent))
    return script or f"{sys.executable} -m finetune_cli"


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
