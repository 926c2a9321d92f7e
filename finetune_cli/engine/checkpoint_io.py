"""Checkpoint state without pickle: optimizer, scheduler, gradient scaler and RNG states.

A checkpoint is read back when a run resumes, and run directories get copied between machines and
shared, so nothing in one may execute code when it is read. Each state (a nested structure of
dicts, lists, tuples, numbers, strings, tensors and numpy arrays) is stored as two files:

- ``<name>.json``: the structure, with every tensor and array replaced by a reference;
- ``<name>.safetensors``: the tensors (arrays as tensors, their numpy dtype in the JSON).

Neither format can run code, and nothing else is read: a pickled ``<name>.pt`` (what
``torch.save`` writes) is never loaded, so a crafted pickle in a checkpoint is a missing file, not a
program.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from finetune_cli.errors import CorruptCheckpointError, error_text

_T, _A, _TUP, _ITEMS = "__tensor__", "__ndarray__", "__tuple__", "__items__"


def _encode(obj: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
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
