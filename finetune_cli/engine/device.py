"""The one device resolver (``--device auto|cpu|cuda|cuda:N`` -> a ``torch.device``), the one
precision rule (``auto|fp32|bf16|fp16`` on that device -> fp32, bf16 or fp16), and what the CUDA-graph
paths share (the bucket width, whether a device captures, the capture itself)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Optional

import torch

from finetune_cli.errors import DeviceError, FinetuneError

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


PRECISIONS = ("auto", "fp32", "bf16", "fp16")
_AUTOCAST = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_precision(spec: str, device: torch.device, key: str = "--precision",
                      error: type[FinetuneError] = DeviceError) -> str:
    """The one precision rule of every command (training and inference): ``auto`` is bf16 on a
    CUDA device that has it, else fp32; ``fp32``/``bf16`` anywhere (bf16 on the CPU only when asked:
    it changes the numbers, and fp32 there is exact); ``fp16`` needs a GPU. Returns fp32, bf16 or
    fp16; ``key`` names the option or recipe key in the error, ``error`` its class."""
    if spec not in PRECISIONS:
        raise error(f"{key} {spec!r}: expected {', '.join(PRECISIONS[:-1])} or {PRECISIONS[-1]}")
    on_gpu = torch.device(device).type == "cuda"
    if spec == "auto":
        return "bf16" if on_gpu and torch.cuda.is_bf16_supported() else "fp32"
    if spec == "fp16" and not on_gpu:
        raise error(f"{key} fp16 needs a GPU; use fp32 or bf16 on the CPU")
    return spec


def autocast_dtype(precision: str):
    """The ``torch.autocast`` dtype of a resolved precision (None: fp32, no autocast)."""
    return _AUTOCAST[precision]


# Batch widths of the CUDA-graph paths (training's step, inference's forward): multiples of this, at
# most the model's length, so a run meets a handful of shapes, one graph each.
GRAPH_MULTIPLE = 32


def device_can_capture(device: torch.device) -> bool:
    """Whether ``device`` replays CUDA graphs (the tests stand in for a GPU by patching this)."""
    return device.type == "cuda"


_SIDE_STREAMS: dict[torch.device, Any] = {}


def side_stream(device: torch.device) -> Any:
    """The one side stream of ``device`` in this process, where every warm-up and capture runs.
    One, not a fresh one each time: cuBLAS keeps a workspace (~64 MiB on a Hopper GPU) for every
    stream it has run on, for the life of the process, so a fresh stream per capture left 64 MiB
    allocated per graph, run after run (seen on an H200: +0.125 GiB left by each run that captured
    two shapes)."""
    key = torch.device(device)
    if key not in _SIDE_STREAMS:
        _SIDE_STREAMS[key] = torch.cuda.Stream(key)
    return _SIDE_STREAMS[key]


def on_side_stream(fn: Callable[[], Any], device: torch.device) -> None:
    """Run ``fn`` on the side stream, after the work queued so far, and make the current stream
    wait for it: warm-ups before a capture run there (torch's rule for CUDA graphs)."""
    side = side_stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream(device).wait_stream(side)


def capture_graph(fn, device: torch.device, pool: Any = None, *, warmups: int = 1,
                  settle: Optional[Callable[[], None]] = None) -> tuple[Any, Any]:
    """``(graph, what fn returned inside it)``: ``fn`` run ``warmups`` times on a side stream (lazy
    initialisations, cuBLAS workspaces and kernel choices must not happen inside a capture), then
    ``settle()`` (undo what the warm-up changed), then ``fn`` captured as a CUDA graph in ``pool``
    (graphs of one path share it), on the same side stream. Both graph paths capture through here: the training step
    (``engine.step.GraphedStep``) and the inference forward (``engine.inference.GraphedForward``)."""
    if warmups:
        on_side_stream(lambda: [fn() for _ in range(warmups)], device)
    if settle is not None:
        settle()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=side_stream(device)):  # the warm-ups' stream: its workspaces
        out = fn()
    return graph, out
