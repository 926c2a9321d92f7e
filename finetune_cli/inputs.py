"""What a command reads from local disk, so that what it writes can be kept apart from it
(``fsutil.check_apart``): an output that is an input, holds one or lies inside one is refused before
anything is written or deleted."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from finetune_cli.checkpoint import run_model_dir
from finetune_cli.fsutil import check_apart
from finetune_cli.recipe import Recipe
from finetune_cli.rundir import ADAPTER_CONFIG, RunDir


def model_inputs(name: str | Path, whole_run: bool = True) -> list[tuple[str, Path]]:
    """The folders a command that reads model ``name`` reads (for ``fsutil.check_apart``): the run
    directory (``whole_run``), the model folder it stands for, and a LoRA adapter's local base
    model. A hub id or a missing path reads nothing local: []."""
    p = Path(name).expanduser()
    if not p.is_dir():
        return []
    run = RunDir(p)
    folder = run_model_dir(run) if run.is_run() else p
    out = [("run directory", p)] if run.is_run() and whole_run else []
    if folder is not None:
        out.append(("model folder", folder))
        with contextlib.suppress(OSError, ValueError, AttributeError):
            base = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8")).get("base_model_name_or_path")
            if isinstance(base, str) and Path(base).expanduser().is_dir():
                out.append(("adapter's base model", Path(base).expanduser()))
    return out


def recipe_inputs(recipe: Recipe) -> list[tuple[str, Path]]:
    """What a run of ``recipe`` reads from local disk: its model folders and data files (``pkg:`` and
    ``data:`` names lie in the package and the data folder, which no run folder is made in)."""
    out = list(model_inputs(recipe.model.name)) if recipe.model.name != "embedded" else []
    for what, f in (("training data", recipe.data.train), ("evaluation data", recipe.data.eval)):
        if f and not f.startswith(("pkg:", "data:")):
            out.append((what, Path(f).expanduser()))
    return out


CWD = (("current folder", "."),)  # a folder replaced whole cannot be (or hold) the one we stand in


def check_output_apart(output: Path, recipe: Recipe, what: str = "output folder") -> None:
    """``output`` (a run, probe or sweep folder, which ``--overwrite`` empties) is not, and neither
    holds nor lies inside, what ``recipe`` reads, nor the current folder (``fsutil.check_apart``)."""
    check_apart(output, recipe_inputs(recipe), what, around=CWD)
