"""The run directory: its layout, its checkpoints, and the recipe stored in it.

One home for what every command knows about ``runs/<name>/``::

    recipe.yaml          the resolved recipe the run was started with
    metrics.jsonl        one JSON record per log line and per evaluation
    checkpoint-<step>/   model/, optimizer/scheduler/RNG state, trainer_state.json, recipe.yaml
    best/                the model at the best evaluation (+ eval_metrics.json)
    final/               the model at the end of training
    summary.json         written last: the run is complete
    .finetune.lock       advisory lock of the process training into it (see RunLock)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import struct
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

import yaml

from finetune_cli.errors import CorruptCheckpointError, RecipeError, RunDirError
from finetune_cli.fsutil import WRITE_TEST_PREFIX
from finetune_cli.recipe import Recipe, build_recipe

RECIPE = "recipe.yaml"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
EVAL = "eval.json"  # `finetune eval` of the run on its own evaluation data
BEST = "best"
FINAL = "final"
STATE_FILE = "trainer_state.json"
CHECKPOINT_MODEL = "model"
LOCK = ".finetune.lock"
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


# ---- integrity ---------------------------------------------------------------------------------
# A crash mid-write cannot leave a torn checkpoint (it is written to a temp folder and renamed), but
# a copy, a sync or a full disk can. These checks read headers and parse small files; they never
# unpickle anything and cost milliseconds, so every resume runs them.

def file_problem(f: Path) -> Optional[str]:
    """Why file ``f`` is unreadable (truncated, garbage), or None when it looks intact. Checks by
    kind: JSON and YAML parse, a safetensors header matches the file size, a torch ``.pt`` zip
    archive passes its CRCs. Other files are only checked to be readable."""
    try:
        size = f.stat().st_size
        if f.suffix == ".json":
            json.loads(f.read_text(encoding="utf-8"))
        elif f.suffix in (".yaml", ".yml"):
            yaml.safe_load(f.read_text(encoding="utf-8"))
        elif f.suffix == ".safetensors":
            with f.open("rb") as fh:
                head = fh.read(8)
                if len(head) < 8:
                    return f"{f.name} is truncated ({size} bytes)"
                n = struct.unpack("<Q", head)[0]
                if n > size - 8:
                    return f"{f.name} is truncated or not safetensors (header of {n} bytes, file of {size})"
                header = json.loads(fh.read(n))
            end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
            if 8 + n + end != size:
                return f"{f.name} is truncated ({size} bytes, its header needs {8 + n + end})"
        elif f.suffix in (".pt", ".bin"):
            if not zipfile.is_zipfile(f):
                return f"{f.name} is not a torch archive (garbage or truncated, {size} bytes)"
            with zipfile.ZipFile(f) as z:
                bad = z.testzip()
            if bad is not None:
                return f"{f.name} is damaged (bad CRC in {bad})"
        else:
            with f.open("rb") as fh:
                fh.read(1)
    except (OSError, ValueError, KeyError, TypeError, IndexError, struct.error, zipfile.BadZipFile, yaml.YAMLError) as e:
        return f"{f.name} cannot be read ({' '.join(str(e).split())[:100]})"
    return None


def folder_problem(folder: Path) -> Optional[str]:
    """The first damaged file under ``folder`` (``name: why``), or None."""
    if not folder.is_dir():
        return f"{folder.name}/ is missing"
    for f in sorted(folder.rglob("*")):
        if f.is_file() and not f.name.startswith("."):
            why = file_problem(f)
            if why is not None:
                rel = f.relative_to(folder)
                return why.replace(f.name, str(rel), 1)
    return None


def checkpoint_problem(ck: Path, verify: Optional[Callable[[Path], Optional[str]]] = None) -> Optional[str]:
    """Why checkpoint ``ck`` cannot be resumed from, or None. ``verify(ck)`` adds the checks only the
    engine can make (its state files read back)."""
    if not is_complete_checkpoint(ck):
        return f"incomplete (needs {STATE_FILE} and {CHECKPOINT_MODEL}/config.json)"
    why = folder_problem(ck)
    if why is None:
        try:
            state = json.loads((ck / STATE_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):  # pragma: no cover - folder_problem parsed it
            state = None
        if not isinstance(state, dict) or not isinstance(state.get("step"), int):
            why = f"{STATE_FILE} is not a trainer state"
    if why is None and verify is not None:
        why = verify(ck)
    return why


def intact_checkpoint(run_dir: Path, warn: Callable[[str], None],
                      verify: Optional[Callable[[Path], Optional[str]]] = None) -> Optional[Path]:
    """The newest checkpoint of ``run_dir`` that a resume can use; each newer damaged one is named
    through ``warn``. None when there are no checkpoints; :class:`RunDirError` when there are
    some but none is intact (a silent restart would throw the run away)."""
    cks = sorted((p for p in Path(run_dir).glob("checkpoint-*") if checkpoint_step(p) >= 0 and p.is_dir()),
                 key=checkpoint_step, reverse=True)
    damaged = []
    for ck in cks:
        why = checkpoint_problem(ck, verify)
        if why is None:
            for name, w in damaged:
                warn(f"checkpoint {name} is damaged ({w}); resuming from the older {ck.name}")
            return ck
        damaged.append((ck.name, why))
    if damaged:
        listed = "; ".join(f"{n}: {w}" for n, w in damaged)
        raise CorruptCheckpointError(f"no intact checkpoint in {run_dir} to resume from ({listed}); pass "
                                     f"--overwrite to train from scratch")
    return None


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


def read_json_object(f: Path) -> Optional[dict[str, Any]]:
    """A JSON object from a run directory, None when the file is absent; one error line when it is
    truncated, not JSON, or not an object."""
    f = Path(f)
    if not f.is_file():
        return None
    try:
        obj = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise RunDirError(f"{f} is not valid JSON (truncated or damaged)") from None
    if not isinstance(obj, dict):
        raise RunDirError(f"{f} must hold a JSON object, got {type(obj).__name__}")
    return obj


def read_summary(run_dir: Path) -> Optional[dict[str, Any]]:
    return read_json_object(Path(run_dir) / SUMMARY)


def _counts(p: Path) -> bool:
    """Whether an entry makes a run directory non-empty: not our lock, not a writability probe."""
    return p.name != LOCK and not p.name.startswith(WRITE_TEST_PREFIX)


def check_run_dir(run_dir: Path, recipe: Recipe, overwrite: bool,
                  normalise: Callable[[Recipe], Recipe] = lambda r: r) -> Optional[Recipe]:
    """Return the stored recipe if ``run_dir`` holds this same run (so it resumes), None if the
    directory is new or empty; refuse a different run unless ``overwrite`` (then it is deleted).
    ``normalise`` is applied to the stored recipe before comparing (the caller's full validation)."""
    if not run_dir.exists() or not any(_counts(p) for p in run_dir.iterdir()):
        return None
    if nothing_trained(run_dir):  # a start that failed before its first step blocks nothing
        (run_dir / RECIPE).unlink(missing_ok=True)
        return None
    if overwrite:
        # Everything but the lock: our own lock must outlive the deletion, or a second run could
        # take a fresh one while we still train here.
        for p in run_dir.iterdir():
            if p.name != LOCK:
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
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


def nothing_trained(run_dir: Path) -> bool:
    """True when ``run_dir`` holds a recipe and nothing else a run writes (hidden temp files and the
    lock aside): a start that failed before training (bad metric, device, data) left it."""
    entries = [p for p in run_dir.iterdir() if not p.name.startswith(".")]
    return [p.name for p in entries] == [RECIPE]


def first_difference(a: Any, b: Any, prefix: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if k == "output":
                continue
            if a.get(k) != b.get(k):
                return first_difference(a.get(k), b.get(k), f"{prefix}.{k}" if prefix else k)
    return f"{prefix}: {a!r} there, {b!r} now"


class RunLock:
    """An advisory lock on a run directory (``fcntl.flock`` on ``<run_dir>/.finetune.lock``), held by
    the one process that writes there for the whole run.

    The kernel drops a flock when its holder dies (crash, ``kill -9``, lost node), so a lock file
    left behind by a dead process is stale by construction: the next run takes it over and says
    whose it was. A live holder makes :meth:`acquire` raise :class:`RunDirError` naming its PID
    (and host). The file's content (``pid host``) is only for that message.
    """

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK
        self._fd: Optional[int] = None
        self.took_over: Optional[str] = None  # "pid host" of a dead holder we replaced

    def acquire(self) -> RunLock:
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _read_holder(fd)
            os.close(fd)
            pid = holder.split()[0] if holder else "unknown"
            host = f" on {holder.split()[1]}" if len(holder.split()) > 1 else ""
            raise RunDirError(f"output directory {self.path.parent} is in use by another finetune run "
                              f"(PID {pid}{host}); wait for it to finish, stop it, or set output.name") from None
        old = _read_holder(fd)
        if old and old.split()[0] != str(os.getpid()):
            self.took_over = old
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        # The file stays: unlinking it would let a waiting process lock the old inode while a
        # third creates a new file. Its stale content is harmless (see the class docstring).
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def _read_holder(fd: int) -> str:
    with contextlib.suppress(OSError):
        return os.pread(fd, 200, 0).decode(errors="replace").strip()
    return ""
