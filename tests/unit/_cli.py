"""The CLI as a user runs it, in-process: ``invoke`` and the one-error-line check."""

from __future__ import annotations

from typer.testing import CliRunner

from finetune_cli.cli.main import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_error_line(res) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.output
    return lines[0]
