"""The processes of a multi-process run, and what they must agree on.

``torchrun`` and ``accelerate launch`` start one copy of ``finetune train`` per process with
``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` in the environment. :func:`init_distributed` joins them
(through ``accelerate``'s ``PartialState``, so the ``Accelerator`` built later shares the same
process group) and returns a :class:`Processes`: rank, world size, this process's device, and the
few collectives the pipeline and the trainer need on the *control plane* (run directory checks, stop
flags, evaluation results). Those go through a gloo group even when the gradients go through NCCL,
so a control message never makes a GPU stream wait. The rank is the launcher's
(``ui.launched_rank``), so "is this the main process?" has the answer the UI gives.

One process (no launcher) gets a :class:`Processes` whose collectives are identities: single-process
code paths are unchanged.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any, Optional, TypeVar

import torch

from finetune_cli.engine.device import resolve_device
from finetune_cli.engine.rng import capture_rng, restore_rng
from finetune_cli.errors import DeviceError, FinetuneError, PeerLostError
from finetune_cli.ui import is_main_process, launched_rank, launched_world_size

T = TypeVar("T")


class Processes:
    """Rank, world size, this process's device and control-plane collectives. All ranks must call a
    collective in the same order (as with ``torch.distributed``).

    ``device`` is the ``--device`` spec; :attr:`device` resolves it once."""

    def __init__(self, rank: int = 0, world: int = 1, group: Any = None, device: str = "auto"):
        self.rank, self.world, self.group = rank, world, group
        self.device_spec = device
        self._device: Optional[torch.device] = None

    @property
    def is_main(self) -> bool:
        """The main process (``ui.is_main_process`` of this rank: the same answer the UI gives)."""
        return is_main_process(self.rank)

    @property
    def device(self) -> torch.device:
        """This process's device, resolved from the spec the first time it is asked for and kept.
        Under a launcher that is before ``accelerate`` selects this rank's CUDA device, after which
        ``cuda`` would resolve to another index: everyone (``PartialState``, the ``Accelerator``)
        sees the first answer."""
        if self._device is None:
            self._device = resolve_device(self.device_spec)
        return self._device

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def barrier(self) -> None:
        if self.distributed:
            torch.distributed.barrier(group=self.group)

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on at least one (an all-reduce of a 0/1 flag)."""
        if not self.distributed:
            return flag
        t = torch.tensor([1 if flag else 0], dtype=torch.int32)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX, group=self.group)
        return bool(t.item())

    def broadcast(self, obj: T) -> T:
        """The main process's ``obj`` on every rank."""
        if not self.distributed:
            return obj
        box = [obj if self.is_main else None]
        torch.distributed.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def all_gather(self, obj: T) -> list[T]:
        """Every rank's ``obj``, in rank order, on every rank."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(out, obj, group=self.group)
        return out

    def gather_to_main(self, obj: T) -> Optional[list[T]]:
        """Every rank's ``obj`` in rank order on the main process; None elsewhere."""
        if not self.distributed:
            return [obj]
        out: Optional[list[Any]] = [None] * self.world if self.is_main else None
        torch.distributed.gather_object(obj, out, dst=0, group=self.group)
        return out

    def on_main(self, fn: Callable[[], T]) -> Optional[T]:
        """Run ``fn`` on the main process only (deleting a directory, taking a lock) while the others
        wait. The main process gets ``fn``'s result, the others None; an error in ``fn`` is raised on
        every rank (elsewhere as a copy marked ``reported_by_main``), so no rank waits forever."""
        if not self.distributed:
            return fn()
        res: Any = None
        err: Optional[Exception] = None
        if self.is_main:
            try:
                res = fn()
            except Exception as e:  # every rank must hear of it, or the others wait forever
                err = e
        what = None if err is None else (type(err) if isinstance(err, FinetuneError) else None, str(err))
        what = self.broadcast(what)
        if err is not None:
            raise err
        if what is not None:
            cls, msg = what
            e = cls(msg) if cls is not None else RuntimeError(f"the main process failed: {msg}")
            e.reported_by_main = True
            raise e
        return res


def init_distributed(device: str) -> Processes:
    """This process's view of the run: rank, world size, device (``device`` is the ``--device``
    spec) and the control-plane group.

    Under a launcher the first call joins the launcher's processes and later calls return the same
    view (the device resolved once; a later call naming another device is an error). One process
    gets a fresh view per call, since a caller may train on several devices in turn; its device is
    resolved when first asked for."""
    refuse_sharding()
    if _under_launcher():
        set_parent_death_signal()
    world = launched_world_size()
    if world == 1:
        return Processes(device=device)
    global _JOINED
    if _JOINED is None:
        _JOINED = _join(device, world)
    elif _JOINED.device_spec != device:
        raise DeviceError(f"--device {device}: this process already joined its launcher's processes "
                          f"with --device {_JOINED.device_spec}")
    return _JOINED


_JOINED: Optional[Processes] = None


def _join(device: str, world: int) -> Processes:
    """Join through ``accelerate``'s ``PartialState`` (so the ``Accelerator`` built later shares the
    process group), and open the gloo group of the control plane."""
    from accelerate.state import PartialState

    procs = Processes(launched_rank(), world, device=device)
    state = PartialState(cpu=procs.device.type == "cpu")
    if (state.process_index, state.num_processes) != (procs.rank, procs.world):
        raise RuntimeError(f"the process group has this process as {state.process_index} of "
                           f"{state.num_processes}, the launcher (RANK/WORLD_SIZE) as {procs.rank} of {procs.world}")
    # gloo for the control plane; the default group when it is gloo already.
    procs.group = None if torch.distributed.get_backend() == "gloo" else torch.distributed.new_group(backend="gloo")
    return procs


# What `accelerate launch --config_file` sets for a sharded model (accelerate reads these, as
# "true", in AcceleratorState/Accelerator; a config file alone is never read by the Accelerator).
SHARDING_ENV = {"ACCELERATE_USE_FSDP": "FSDP", "ACCELERATE_USE_DEEPSPEED": "DeepSpeed",
                "ACCELERATE_USE_MEGATRON_LM": "Megatron-LM", "ACCELERATE_USE_PARALLELISM_CONFIG": "a parallelism config"}


def refuse_sharding() -> None:
    """Refuse an accelerate config that shards the model (FSDP, DeepSpeed, Megatron-LM, tensor or
    context parallelism): every process here holds the whole model (DDP), evaluates it and saves it
    from the main process, which a sharded model does not hold in full; and on the CPU accelerate
    silently runs such a config as DDP."""
    on = [(var, what) for var, what in SHARDING_ENV.items() if os.environ.get(var, "false").lower() == "true"]
    if on:
        var, what = on[0]
        raise DeviceError(f"the accelerate config asks for {what} ({var}=true): finetune trains a whole copy "
                          f"of the model on each process (DDP) and cannot shard it; use a config with "
                          f"distributed_type MULTI_GPU (or MULTI_CPU), or `finetune train --nproc N`")


# Messages of a collective whose peer is gone (gloo: "Connection closed by peer … typically caused by
# a remote worker crashing"; NCCL: an aborted communicator), lower-cased.
_PEER_GONE = ("closed by peer", "reset by peer", "broken pipe", "nccl communicator", "nccl error")


def peer_lost(exc: BaseException) -> Optional[PeerLostError]:
    """The error to report when ``exc`` says that another process of this multi-process run is gone
    (its collective lost its peer), else None. One process: always None."""
    if launched_world_size() == 1:
        return None
    dist_error = getattr(torch.distributed, "DistError", ())
    msg = re.sub(r"^\[[^\]]*\]\s*", "", str(exc))  # gloo's "[…/pair.cc:553] " source location
    if not (isinstance(exc, dist_error) or any(m in msg.lower() for m in _PEER_GONE)):
        return None
    return PeerLostError(f"process {launched_rank()} of {launched_world_size()}: another process of this run "
                         f"is gone ({msg.split('. ')[0][:160]}); rerun the same command to resume from the last "
                         f"checkpoint")


def _under_launcher() -> bool:
    """Started by torchrun (its agent sets TORCHELASTIC_RUN_ID) or ``accelerate launch`` (any of its
    launchers sets ACCELERATE_MIXED_PRECISION)."""
    return "TORCHELASTIC_RUN_ID" in os.environ or "ACCELERATE_MIXED_PRECISION" in os.environ


def set_parent_death_signal() -> None:
    """Ask Linux to send this process SIGTERM when its parent (the launcher) dies, even by SIGKILL:
    a worker then stops through the same checkpoint-and-exit path as a Ctrl-C instead of training
    on as an orphan. Only under a launcher: a plain ``nohup finetune train &`` must outlive its
    shell."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


# ---- stop requests ----------------------------------------------------------------------------

class StopRequests:
    """SIGINT/SIGTERM set a flag instead of raising mid-step; the trainer polls :meth:`agreed` at
    each step boundary, so every rank stops after the same step and writes one checkpoint.

    One process: a second signal raises ``KeyboardInterrupt`` at once (an impatient Ctrl-C still
    works). Several: repeated signals only keep the flag set (a terminal's Ctrl-C reaches every
    rank *and* the launcher, which forwards it again); the launcher's own kill timeout is the
    hard stop.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, procs: Processes):
        self.procs = procs
        self.requested = False

    def _handler(self, signum, frame) -> None:
        if self.requested and not self.procs.distributed:
            raise KeyboardInterrupt
        self.requested = True

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopRequests]:
        old: dict[int, Any] = {}
        try:
            for s in self.SIGNALS:
                old[s] = signal.signal(s, self._handler)
        except ValueError:  # not the main thread: signals stay as they are
            pass
        try:
            yield self
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    def agreed(self) -> bool:
        """True on every rank when any rank has been asked to stop (an all-reduce per call)."""
        return self.procs.any(self.requested)


# ---- parameters no loss uses --------------------------------------------------------------------

def freeze_unused_parameters(model: torch.nn.Module, probe: Callable[[], torch.Tensor], procs: Processes) -> list[str]:
    """Freeze (``requires_grad=False``) the parameters that get no gradient from one probe step on
    any rank, so DDP never waits for their gradients (its "parameters that were not used in
    producing loss" error). BERT's pooler under mean pooling is the usual case; a head that uses the
    pooler keeps it. Generic on purpose: no list of module names.

    ``probe()`` returns the loss of one batch. The probe leaves no trace: gradients are cleared and
    the RNG states and buffers (e.g. spectral-norm power-iteration vectors) are put back, so a run
    (and its resume) is the same as without the probe. The optimizer may hold a frozen parameter:
    it never gets a gradient, so AdamW skips it, exactly as it skipped it before.

    Why not ``find_unused_parameters=True``: it walks the autograd graph every step to find the
    same answer this finds once.
    """
    rng = capture_rng()
    buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    for _, p in params:
        p.grad = None
    probe().backward()
    used = torch.tensor([p.grad is not None for _, p in params], dtype=torch.int32)
    if procs.distributed:
        torch.distributed.all_reduce(used, op=torch.distributed.ReduceOp.MAX, group=procs.group)
    frozen = []
    with torch.no_grad():
        for (n, p), u in zip(params, used.tolist(), strict=True):
            p.grad = None
            if not u:
                p.requires_grad_(False)
                frozen.append(n)
        for k, v in model.named_buffers():
            v.copy_(buffers[k])
    restore_rng(rng)
    return frozen
