"""The one device resolver: ``--device auto|cpu|cuda|cuda:N`` -> a ``torch.device``."""

from __future__ import annotations

import re

import torch

from finetune_cli.errors import DeviceError

_SPEC = re.compile(r"auto|cpu|cuda(:\d+)?")


def resolve_device(spec: str) -> torch.device:
    """``auto`` is the current CUDA device when there is one, else the CPU. A CUDA device that this
    machine does not have is an error (exit 2), not a silent fall-back."""
    if not _SPEC.fullmatch(spec or ""):
        raise DeviceError(f"--device {spec!r}: expected auto, cpu, cuda or cuda:N")
    if spec == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise DeviceError(f"--device {spec}: no CUDA device is available on this machine")
    idx = int(spec.split(":", 1)[1]) if ":" in spec else torch.cuda.current_device()
    if idx >= torch.cuda.device_count():
        raise DeviceError(f"--device {spec}: only {torch.cuda.device_count()} CUDA device(s) here")
    return torch.device("cuda", idx)
