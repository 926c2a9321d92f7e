"""The run directory: its layout, its checkpoints, and the recipe stored in it.

One home for what every command knows about ``runs/<name>/``::

    recipe.yaml          the resolved recipe the run was started with
    metrics.jsonl        one JSON record per log line and per evaluation
    checkpoint-<step>/   model/, optimizer/scheduler/RNG state, trainer_state.json, recipe.yaml
    best/                the model at the best evaluation (+ eval_metrics.json)
    final/               the model at the end of training
    summary.json         written last: the run is complete
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

import yaml

from finetune_cli.errors import RecipeError, RunDirError
from finetune_cli.recipe import Recipe, build_recipe

RECIPE = "recipe.yaml"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
BEST = "best"
FINAL = "final"
STATE_FILE = "trainer_state.json"
CHECKPOINT_MODEL = "model"
_CHECKPOINT = re.compile(r"checkpoint-(\d+)")
_SEED_DIR = re.compile(r"seed-(-?\d+)")


def is_run_dir(p: Path) -> bool:
    """A folder written by ``finetune train`` (a model folder has a config.json instead)."""
    return (p / RECIPE).is_file() and not (p / "config.json").is_file()


def seed_of(run_dir: Path) -> Optional[int]:
    """k for a ``seed-<k>/`` run of ``finetune train --seeds``, else None."""
    m = _SEED_DIR.fullmatch(Path(run_dir).name)
    return int(m.group(1)) if m else None


def has_recipe(p: Path) -> bool:
    return (p / RECIPE).is_file()


def expand_run_dirs(paths: Sequence[str]) -> list[Path]:
    """Run directories as given; a folder that is not a run but holds runs (``seed-*/``) expands to them."""
    out: list[Path] = []
    for s in paths:
        p = Path(s)
        if not p.is_dir():
            raise RunDirError(f"run directory not found: {s}")
        if has_recipe(p):
            out.append(p)
            continue
        kids = sorted((q for q in p.iterdir() if q.is_dir() and has_recipe(q)),
                      key=lambda q: (seed_of(q) is None, seed_of(q) or 0, q.name))
        if not kids:
            raise RunDirError(f"{s} is not a finetune run directory (no recipe.yaml) and holds none")
        out.extend(kids)
    seen: set[Path] = set()
    uniq = []
    for p in out:
        if p.resolve() not in seen:
            seen.add(p.resolve())
            uniq.append(p)
    return uniq


def checkpoint_step(p: Path) -> int:
    m = _CHECKPOINT.fullmatch(p.name)
    return int(m.group(1)) if m else -1


def is_complete_checkpoint(p: Path) -> bool:
    """A checkpoint that a resume can use: its state and its model were both written."""
    return (p / STATE_FILE).is_file() and (p / CHECKPOINT_MODEL / "config.json").is_file()


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    return sorted((p for p in Path(run_dir).glob("checkpoint-*") if checkpoint_step(p) >= 0 and is_complete_checkpoint(p)),
                  key=checkpoint_step)


def latest_checkpoint(run_dir: Path) -> Optional[Path]:
    cks = list_checkpoints(run_dir)
    return cks[-1] if cks else None


def model_dir(run_dir: Path) -> Optional[Path]:
    """The model a run directory stands for: ``best/``, else ``final/``, else its newest checkpoint."""
    for sub in (BEST, FINAL):
        if (run_dir / sub / "config.json").is_file():
            return run_dir / sub
    ck = latest_checkpoint(run_dir)
    return ck / CHECKPOINT_MODEL if ck is not None else None


def read_recipe(run_dir: Path) -> Recipe:
    """The recipe stored in ``run_dir`` (schema-checked; objective parameters as stored)."""
    f = Path(run_dir) / RECIPE
    try:
        data = yaml.safe_load(f.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise RunDirError(f"{f} cannot be read ({' '.join(str(e).split())[:120]})") from None
    if not isinstance(data, dict):
        raise RunDirError(f"{f} is not a recipe (a YAML mapping), got {type(data).__name__}")
    model = data.get("model")
    if isinstance(model, dict) and "pooling" in model and "head" not in model:
        # Written before `model.head` existed (finetune < 0.2, which wrote every key): its
        # classifier was always model.pooling + linear, so the run resumes with that head.
        model["head"] = "pooled"
    try:
        return build_recipe(data, str(f))
    except RecipeError as e:
        raise RunDirError(f"{f} is not a valid recipe for this version: {e}") from None


def read_summary(run_dir: Path) -> Optional[dict[str, Any]]:
    f = Path(run_dir) / SUMMARY
    if not f.is_file():
        return None
    try:
        return json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise RunDirError(f"{f} is not valid JSON") from None


def check_run_dir(run_dir: Path, recipe: Recipe, overwrite: bool,
                  normalise: Callable[[Recipe], Recipe] = lambda r: r) -> Optional[Recipe]:
    """Return the stored recipe if ``run_dir`` holds this same run (so it resumes), None if the
    directory is new or empty; refuse a different run unless ``overwrite`` (then it is deleted).
    ``normalise`` is applied to the stored recipe before comparing (the caller's full validation)."""
    if not run_dir.exists() or not any(run_dir.iterdir()):
        return None
    if overwrite:
        shutil.rmtree(run_dir)
        return None
    if not (run_dir / RECIPE).is_file():
        raise RunDirError(f"output directory {run_dir} is not empty and holds no finetune run; "
                          f"choose another output.name or pass --overwrite")
    try:
        old = normalise(read_recipe(run_dir))
    except (RunDirError, RecipeError):
        raise RunDirError(f"output directory {run_dir} holds a run whose recipe.yaml cannot be read; "
                          f"pass --overwrite to replace it") from None
    if old.fingerprint() != recipe.fingerprint():
        diff = first_difference(old.to_dict(), recipe.to_dict())
        raise RunDirError(f"output directory {run_dir} holds a different run ({diff}); "
                          f"pass --overwrite to replace it, or set output.name")
    return old


def first_difference(a: Any, b: Any, prefix: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if k == "output":
                continue
            if a.get(k) != b.get(k):
                return first_difference(a.get(k), b.get(k), f"{prefix}.{k}" if prefix else k)
    return f"{prefix}: {a!r} there, {b!r} now"
