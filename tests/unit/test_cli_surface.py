"""What a user sees of the command itself: a closed stdout pipe (``finetune ... | head -1``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

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
