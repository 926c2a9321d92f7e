"""Checkpoint state without pickle: optimizer, scheduler, gradient scaler and RNG states.

A checkpoint is read back when a run resumes, and run directories get copied between machines and
shared, so nothing in one may execute code when it is read. Each state (a nested structure of
dicts, lists, tuples, numbers, strings, tensors and numpy arrays) is stored as two files:

- ``<name>.json``: the structure, with every tensor and array replaced by a reference;
- ``<name>.safetensors``: the tensors (arrays as tensors, their numpy dtype in the JSON).

Neither format can run code. Checkpoints of finetune 0.1 (``<name>.pt``, written with
``torch.save``) are read with ``torch.load(weights_only=True)`` and an explicit allow-list of the
three numpy names an RNG state needs (numpy's array reconstruction); any other global in such a file
is refused, so a crafted pickle is an error, not a program.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from finetune_cli.errors import CorruptCheckpointError

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
    return (Path(directory) / f"{name}.json").is_file() or (Path(directory) / f"{name}.pt").is_file()


def load_state(directory: Path, name: str) -> Any:
    """Read a state written by :func:`save_state` (or a 0.1 ``<name>.pt``, safely). Raises
    :class:`CorruptCheckpointError` naming the file when it cannot be read."""
    directory = Path(directory)
    js = directory / f"{name}.json"
    if not js.is_file():
        legacy = directory / f"{name}.pt"
        if legacy.is_file():
            return load_legacy(legacy)
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
            raise CorruptCheckpointError(f"checkpoint file {st} cannot be read ({' '.join(str(e).split())[:80]})") from None
    try:
        return _decode(tree, tensors)
    except (KeyError, TypeError, ValueError) as e:
        raise CorruptCheckpointError(f"checkpoint file {js} does not match {st.name} ({type(e).__name__})") from None


def _legacy_globals() -> list:
    core = getattr(np, "_core", None) or np.core  # numpy 2 / 1
    return [np.ndarray, np.dtype, core.multiarray._reconstruct, type(np.dtype(np.uint32))]


def load_legacy(path: Path) -> Any:
    """A finetune 0.1 ``.pt`` state: only tensors, containers, numbers and numpy arrays are let in."""
    import warnings

    try:
        with torch.serialization.safe_globals(_legacy_globals()), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "pickle protocol 4": 0.1 wrote protocol 4; it loads
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # an unpickling error (unsafe global), truncation, or garbage
        reason = " ".join(str(e).split())
        what = "holds objects that are not plain data (refused: loading it could run code)" if (
            "weights_only" in reason or "global" in reason.lower()) else "cannot be read"
        raise CorruptCheckpointError(f"checkpoint file {path} {what}") from None


def states_problem(ck: Path) -> Optional[str]:
    """Why the engine's states in checkpoint ``ck`` cannot be read back (never unpickled), or None:
    optimizer, scheduler, the scaler when there is one, and every RNG state (``rng-<rank>`` of each
    process, or a 0.1 checkpoint's single ``rng``)."""
    ck = Path(ck)
    rngs = sorted({p.name.split(".")[0] for p in ck.glob("rng-*.json")}) or ["rng"]
    for name in ("optimizer", "scheduler", "scaler", *rngs):
        if name == "scaler" and not has_state(ck, name):
            continue
        try:
            load_state(ck, name)
        except CorruptCheckpointError as e:
            return str(e)
    return None
