"""Checkpoints: the one home of ``checkpoint-<step>/`` folders.

Everything the tool knows about a checkpoint lives here: its layout, writing it aside and renaming
it into place, reading it back, verifying it, choosing the one a run resumes from (the newest intact
one, or ``--resume``'s), pruning old ones, the interrupt checkpoint, and which model a run folder
stands for (``best/``, else ``final/``, else its newest checkpoint's). It sits just above
``rundir`` (the rest of a run folder's layout) so that the model loader, below the engine, can find a
run's model; the trainer hands it the states to store and never names a file.

A checkpoint::

    checkpoint-<step>/
        model/               the model, as a loadable folder
        trainer_state.json   the loop's state (step, epoch, position in the epoch, best metric ...)
        recipe.yaml          the recipe it was written under
        optimizer.json/.safetensors, scheduler.*, scaler.* (fp16 only), rng-<rank>.* (one per process)

States without pickle: a checkpoint is read back when a run resumes, and run directories get copied
between machines and shared, so nothing in one may execute code when it is read. Each state (a
nested structure of dicts, lists, tuples, numbers, strings, tensors and numpy arrays) is stored as two
files:

- ``<name>.json``: the structure, with every tensor and array replaced by a reference;
- ``<name>.safetensors``: the tensors (arrays as tensors, their numpy dtype in the JSON).

Neither format can run code, and nothing else is read: a pickled ``<name>.pt`` (what
``torch.save`` writes) is never loaded, so a crafted pickle in a checkpoint is a missing file, not a
program.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from finetune_cli.errors import CorruptCheckpointError, RunDirError, error_text
from finetune_cli.fsutil import atomic_dir
from finetune_cli.rundir import RECIPE, RunDir, folder_problem, holds_model

if TYPE_CHECKING:
    import torch

STATE_FILE = "trainer_state.json"
MODEL = "model"
_NAME = re.compile(r"checkpoint-(\d+)")

_T, _A, _TUP, _ITEMS = "__tensor__", "__ndarray__", "__tuple__", "__items__"


def _encode(obj: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    import numpy as np
    import torch

    if isinstance(obj, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = obj.detach().to("cpu").contiguous().clone()
        return {_T: key}
    if isinstance(obj, np.ndarray):
        key = f"t{len(tensors)}"
        tensors[key] = torch.from_numpy(np.ascontiguousarray(obj).astype(np.int64 if obj.dtype.kind in "ui" else obj.dtype))
        return {_A: key, "dtype": obj.dtype.str}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, tuple):
        return {_TUP: [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: _encode(v, tensors, f"{where}.{k}") for k, v in obj.items()}
        return {_ITEMS: [[_encode(k, tensors, where), _encode(v, tensors, f"{where}[{k!r}]")] for k, v in obj.items()]}
    raise TypeError(f"cannot store a {type(obj).__name__} at {where} in a checkpoint")


def _decode(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    import numpy as np

    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if _T in obj:
        return tensors[obj[_T]]
    if _A in obj:
        return tensors[obj[_A]].numpy().astype(np.dtype(obj["dtype"]))
    if _TUP in obj:
        return tuple(_decode(v, tensors) for v in obj[_TUP])
    if _ITEMS in obj:
        return {_decode(k, tensors): _decode(v, tensors) for k, v in obj[_ITEMS]}
    return {k: _decode(v, tensors) for k, v in obj.items()}


def save_state(obj: Any, directory: Path, name: str) -> None:
    """Write ``obj`` as ``directory/<name>.json`` (+ ``<name>.safetensors`` when it holds tensors).
    The directory is a checkpoint's temporary folder: atomicity comes from renaming that folder."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    tree = _encode(obj, tensors, name)
    directory = Path(directory)
    if tensors:
        save_file(tensors, str(directory / f"{name}.safetensors"))
    (directory / f"{name}.json").write_text(json.dumps({"format": 1, "tree": tree}))


def has_state(directory: Path, name: str) -> bool:
    return (Path(directory) / f"{name}.json").is_file()


def load_state(directory: Path, name: str) -> Any:
    """Read a state written by :func:`save_state`. Raises :class:`CorruptCheckpointError` naming the
    file when it cannot be read. A pickled ``<name>.pt`` in its place is never loaded."""
    directory = Path(directory)
    js = directory / f"{name}.json"
    if not js.is_file():
        raise CorruptCheckpointError(f"checkpoint file {js} is missing")
    try:
        doc = json.loads(js.read_text(encoding="utf-8"))
        tree = doc["tree"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise CorruptCheckpointError(f"checkpoint file {js} cannot be read ({type(e).__name__})") from None
    st = directory / f"{name}.safetensors"
    tensors: dict[str, torch.Tensor] = {}
    if st.is_file():
        from safetensors.torch import load_file

        try:
            tensors = load_file(str(st))
        except Exception as e:  # safetensors raises its own error types for truncated/garbage files
            raise CorruptCheckpointError(f"checkpoint file {st} cannot be read ({error_text(e, 80)})") from None
    try:
        return _decode(tree, tensors)
    except (KeyError, TypeError, ValueError) as e:
        raise CorruptCheckpointError(f"checkpoint file {js} does not match {st.name} ({type(e).__name__})") from None


def states_problem(ck: Path) -> Optional[str]:
    """Why the engine's states in checkpoint ``ck`` cannot be read back (never unpickled), or None:
    optimizer, scheduler, the scaler when there is one, and every RNG state (``rng-<rank>`` of each
    process)."""
    ck = Path(ck)
    rngs = sorted({p.name.split(".")[0] for p in ck.glob("rng-*.json")}) or ["rng-0"]
    for name in ("optimizer", "scheduler", "scaler", *rngs):
        if name == "scaler" and not has_state(ck, name):
            continue
        try:
            load_state(ck, name)
        except CorruptCheckpointError as e:
            return str(e)
    return None


# ---- the folder -------------------------------------------------------------------------------

def checkpoint_step(p: Path) -> int:
    """k for a ``checkpoint-<k>`` folder, else -1."""
    m = _NAME.fullmatch(Path(p).name)
    return int(m.group(1)) if m else -1


def is_complete(ck: Path) -> bool:
    """A checkpoint that a resume can use: its state and its model were both written."""
    return (ck / STATE_FILE).is_file() and holds_model(ck / MODEL)


def checkpoint_problem(ck: Path) -> Optional[str]:
    """Why checkpoint ``ck`` cannot be resumed from, or None: complete, every file intact (headers
    and small files parsed, nothing unpickled), a trainer state, and every engine state readable."""
    ck = Path(ck)
    if not ck.is_dir():
        return "not a directory"
    if not is_complete(ck):
        return f"incomplete (needs {STATE_FILE} and {MODEL}/config.json)"
    why = folder_problem(ck)
    if why is None:
        try:
            state = json.loads((ck / STATE_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):  # pragma: no cover - folder_problem parsed it
            state = None
        if not isinstance(state, dict) or not isinstance(state.get("step"), int):
            why = f"{STATE_FILE} is not a trainer state"
    return why if why is not None else states_problem(ck)


@dataclass
class Restored:
    """What a checkpoint gives back to the trainer: its states by name (``optimizer``, ``scheduler``,
    ``scaler`` when written), the loop's state, and this rank's RNG state (None when the checkpoint
    was written by fewer processes: a fresh stream, and the resume is not exact)."""

    states: dict[str, Any]
    trainer_state: dict[str, Any]
    rng: Optional[dict[str, Any]]


class Checkpointer:
    """The checkpoints of one run folder: write, read, verify, pick, prune.

    ``keep``: how many complete checkpoints :meth:`write` leaves (the newest ones, never the one it
    just wrote). It remembers the step last written (``last_written``; the trainer sets it on every
    rank, since only the main process writes), so the checkpoint of an interrupted run or the final
    one is not written twice (:meth:`written`)."""

    OPTIONAL_STATES = ("scaler",)

    def __init__(self, run: RunDir | Path | str, keep: int = 0):
        self.run = run if isinstance(run, RunDir) else RunDir(run)
        self.keep = keep
        self.last_written: Optional[int] = None

    def path(self, step: int) -> Path:
        return self.run.path / f"checkpoint-{step}"

    @staticmethod
    def model(ck: Path) -> Path:
        """The loadable model folder inside checkpoint ``ck``."""
        return Path(ck) / MODEL

    # ---- list and pick ------------------------------------------------------------------------
    def list(self, complete: bool = True) -> list[Path]:
        """Checkpoint folders, oldest first (only those a resume can use, unless ``complete`` is off)."""
        d = self.run.path
        found = (p for p in d.glob("checkpoint-*") if checkpoint_step(p) >= 0 and p.is_dir()) if d.is_dir() else ()
        return sorted((p for p in found if not complete or is_complete(p)), key=checkpoint_step)

    def latest(self) -> Optional[Path]:
        cks = self.list()
        return cks[-1] if cks else None

    def last_good(self, before_step: int) -> Optional[Path]:
        """The newest complete checkpoint before ``before_step`` (named when a loss turns non-finite)."""
        good = [c for c in self.list() if checkpoint_step(c) < before_step]
        return good[-1] if good else None

    def intact(self, warn: Callable[[str], None]) -> Optional[Path]:
        """The newest checkpoint a resume can use; each newer damaged one is named through ``warn``.
        None when there are no checkpoints; :class:`CorruptCheckpointError` when there are some but
        none is intact (a silent restart would throw the run away)."""
        damaged = []
        for ck in reversed(self.list(complete=False)):
            why = checkpoint_problem(ck)
            if why is None:
                for name, w in damaged:
                    warn(f"checkpoint {name} is damaged ({w}); resuming from the older {ck.name}")
                return ck
            damaged.append((ck.name, why))
        if damaged:
            listed = "; ".join(f"{n}: {w}" for n, w in damaged)
            raise CorruptCheckpointError(f"no intact checkpoint in {self.run.path} to resume from ({listed}); pass "
                                         f"--overwrite to train from scratch")
        return None

    def resume_point(self, resume: Optional[str], warn: Callable[[str], None],
                     same_job: Callable[[RunDir, str], None]) -> Optional[Path]:
        """The resume choice: ``--resume``'s checkpoint (checked, and ``same_job(its folder as a
        RunDir, where)`` raises unless it holds this job), else this run's newest intact one."""
        if not resume:
            return self.intact(warn)
        ck = Path(resume)
        why = checkpoint_problem(ck)
        if why is not None:
            raise RunDirError(f"--resume {resume}: not a usable checkpoint ({why})")
        same_job(RunDir(ck), f"--resume {resume}: checkpoint")
        return ck

    def prune(self, keep: int, protect: int) -> None:
        """Delete all but the newest ``keep`` complete checkpoints, never the one of step ``protect``."""
        cks = self.list()
        for old in cks[:-keep] if keep > 0 else cks:
            if checkpoint_step(old) != protect:
                shutil.rmtree(old, ignore_errors=True)

    # ---- write and read -----------------------------------------------------------------------
    def write(self, step: int, *, save_model: Callable[[Path], None], states: Mapping[str, Any],
              rngs: list[dict[str, Any]], recipe_yaml: str, trainer_state: Mapping[str, Any]) -> Path:
        """Write ``checkpoint-<step>/`` aside and rename it into place, then prune to ``keep``.
        ``states``: the engine's states by name (stored without pickle); ``rngs``: every rank's
        RNG state in rank order."""
        target = self.path(step)
        with atomic_dir(target) as tmp:
            save_model(tmp / MODEL)
            for name, obj in states.items():
                save_state(obj, tmp, name)
            for r, rank_rng in enumerate(rngs):
                save_state(rank_rng, tmp, f"rng-{r}")
            (tmp / RECIPE).write_text(recipe_yaml)
            (tmp / STATE_FILE).write_text(json.dumps(dict(trainer_state), indent=2))
        self.last_written = step
        if self.keep:
            self.prune(keep=self.keep, protect=step)
        return target

    def written(self, step: int) -> Optional[Path]:
        """The checkpoint of ``step`` when this Checkpointer just wrote it, else None."""
        return self.path(step) if self.last_written == step else None

    def read(self, ck: Path, rank: int = 0) -> Restored:
        """The states of checkpoint ``ck`` (``rank``: whose RNG state)."""
        ck = Path(ck)
        states = {name: load_state(ck, name) for name in ("optimizer", "scheduler", *self.OPTIONAL_STATES)
                  if name not in self.OPTIONAL_STATES or has_state(ck, name)}
        trainer_state = json.loads((ck / STATE_FILE).read_text(encoding="utf-8"))
        rng = load_state(ck, f"rng-{rank}") if has_state(ck, f"rng-{rank}") else None
        return Restored(states, trainer_state, rng)


def run_model_dir(run: RunDir) -> Optional[Path]:
    """The model a run folder stands for: ``best/``, else ``final/``, else its newest checkpoint's."""
    for sub in (run.best, run.final):
        if holds_model(sub):
            return sub
    ck = Checkpointer(run).latest()
    return Checkpointer.model(ck) if ck is not None else None
