"""One optimizer step of the training loop, two ways.

:class:`EagerStep` runs it as written: for each micro-batch the forward pass, the loss and the
backward pass, then clipping, the optimizer and the scheduler. Every kernel is launched from Python,
one at a time: on a GPU, at batch 32, a BERT-size step spends ~98 % of its time launching kernels
(~600 of them at ~30 µs of host work each) while the GPU waits.

:class:`GraphedStep` captures the same work once per batch shape as a CUDA graph and replays it: one
launch for the forward, loss and backward of a micro-batch (one graph per padded width: batches are
padded up to a multiple of :data:`~finetune_cli.engine.device.GRAPH_MULTIPLE`, so a run meets a handful of widths), and one for
clipping, the optimizer and zeroing the gradients. What that needs, and how it is met:

- static memory: each graph reads its batch from buffers the real batch is copied into, and the
  gradients, the optimizer's state and the loss accumulators are allocated once, before any capture,
  and only ever written in place (the gradients are zeroed inside the update graph, never freed);
- no host read inside a step: the loss parts accumulate on the device (read at the log points, as in
  the eager step), the gradient norm is never read, and the learning rate is a device tensor
  (``torch.optim.AdamW(lr=tensor, fused=True, capturable=True)``) that the scheduler writes in place
  between replays (torch's schedulers ``fill_`` a tensor learning rate);
- randomness: dropout and noise draw from the default CUDA generator, which graphs replay safely
  (each replay advances its offset), so the masks stay a function of the RNG state a checkpoint
  stores; the warm-up run before a capture restores that state and the gradients it touched, so a
  resumed run (which captures at other steps) replays the same stream;
- an objective that reads a value on the host or makes a shape from data cannot be captured: it says
  so (``Objective.capture_refusal``) and the loop runs eagerly.

On a device that cannot capture (the CPU) :class:`GraphedStep` runs the same static-buffer code
eagerly (``capture=False``): the tests check it against :class:`EagerStep` there.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Iterator
from typing import Any, Optional

import torch

from finetune_cli.data.encode import copy_into, shape_key, to_device
from finetune_cli.data.sampling import Padding
from finetune_cli.engine.device import capture_graph, device_can_capture, on_side_stream
from finetune_cli.objectives._dist import LEFT_OUT

StepOut = tuple[int, tuple[str, ...], torch.Tensor]  # examples trained on, loss-part names, their sums (device)


def graph_refusal(cfg, device: torch.device, world: int, objective) -> Optional[str]:
    """Why the training step of this run cannot be captured as a CUDA graph, or None."""
    if not device_can_capture(device):
        return f"training runs on {device.type}, not on a CUDA GPU"
    if world > 1:
        return f"{world} processes (the graph path runs one process; DDP's gradient all-reduce stays eager)"
    if cfg.precision == "fp16":
        return "train.precision=fp16 (its gradient scaler reads the gradients on the host every step)"
    if cfg.optimizer not in ("adamw_fused", "adamw"):
        return f"train.optimizer={cfg.optimizer} (the graph path steps torch's AdamW, fused and capturable)"
    if cfg.compile or cfg.gradient_checkpointing:
        return "train.compile" if cfg.compile else "train.gradient_checkpointing"
    return objective.capture_refusal()


def use_graphs(cfg, device: torch.device, world: int, objective, log) -> bool:
    """``train.cuda_graphs``: on (refused in one line where it cannot run), auto (used where it can,
    otherwise one line saying why not), off."""
    from finetune_cli.errors import TrainingError

    if cfg.cuda_graphs == "off":
        return False
    why = graph_refusal(cfg, device, world, objective)
    if why is None:
        return True
    if cfg.cuda_graphs == "on":
        raise TrainingError(f"train.cuda_graphs=on: this step cannot be captured: {why}; set train.cuda_graphs=auto "
                            "or off")
    if device.type == "cuda":  # on the CPU there is nothing to say: auto means "where a GPU can"
        log(f"train.cuda_graphs=auto: eager steps: {why}")
    return False


def _parts(out: dict[str, Any], objective) -> dict[str, torch.Tensor]:
    return {k: out[k].detach().float() for k in ("loss", *objective.parts) if k in out}


class EagerStep:
    """The step as written (see the module docstring). ``acc``: the run's ``Accelerator``."""

    def __init__(self, acc, model, objective, optimizer, scheduler, max_grad_norm: Optional[float], world: int):
        self.acc, self.model, self.objective = acc, model, objective
        self.optimizer, self.scheduler, self.max_grad_norm, self.world = optimizer, scheduler, max_grad_norm, world

    def __call__(self, stream: Iterator[Any], micro: list[list[int]], n_real: int) -> StepOut:
        """One optimizer step over the micro-batches ``micro`` (gradient accumulation; the gradients
        are synchronised on the last one only; each loss divided by ``n_real``, the micro-batches that
        are not ``Padding``), with clipping and the scheduler's step. Returns the examples trained on,
        the names of the loss parts and their sums over the micro-batches, left on the device."""
        parts_sum: dict[str, torch.Tensor] = {}
        n_samples = 0
        for j, idx in enumerate(micro):
            batch = to_device(next(stream), self.acc.device)
            sync = j == len(micro) - 1
            ctx = self.acc.no_sync(self.model) if not sync and self.world > 1 else contextlib.nullcontext()
            pad = isinstance(idx, Padding)  # zero weight, and out of the batch gathered across processes
            if pad:
                batch[LEFT_OUT] = True
            with ctx, self.acc.autocast():
                out = self.objective(self.model, batch)
            self.acc.backward(out["loss"] * 0.0 if pad else out["loss"] / n_real)
            for k, v in _parts(out, self.objective).items():
                v = v * 0.0 if pad else v
                parts_sum[k] = parts_sum[k] + v if k in parts_sum else v
            n_samples += 0 if pad else len(idx)
        keys = tuple(parts_sum)
        parts = torch.stack([parts_sum[k] for k in keys])
        if self.max_grad_norm is not None:
            self.acc.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return n_samples, keys, parts


class GraphedStep:
    """The step replayed from CUDA graphs (see the module docstring); ``capture=False`` runs the same
    static-buffer code eagerly (the CPU). The optimizer must be torch's AdamW built with a tensor
    learning rate, ``fused=True, capturable=True`` (``engine.setup.build_optimizer(graphs=True)``)."""

    def __init__(self, acc, model, objective, optimizer, scheduler, max_grad_norm: Optional[float],
                 capture: bool = True):
        self.acc, self.model, self.objective, self.scheduler = acc, model, objective, scheduler
        self.optimizer = getattr(optimizer, "optimizer", optimizer)  # the torch optimizer under accelerate's
        self.max_grad_norm, self.capture = max_grad_norm, capture
        self.device = acc.device
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.graphs: dict[tuple, tuple[Any, Any]] = {}  # shape key -> (graph or None, static batch)
        self.update_graph: Any = None
        self.pool: Any = None
        self.keys: Optional[tuple[str, ...]] = None
        self.acc_parts: Optional[torch.Tensor] = None  # this step's loss parts, summed over micro-batches
        self.weight = torch.ones((), device=self.device)  # 1 / the step's micro-batches: a static input
        self.widths: set[int] = set()
        self.capture_seconds = 0.0
        self._ready = False

    def summary(self) -> dict[str, Any]:
        """What ``summary.json`` records of the graph path."""
        return {"widths": sorted(self.widths), "graphs": len(self.graphs) + (self.update_graph is not None),
                "capture_seconds": round(self.capture_seconds, 3), "captured": self.capture}

    # ---- the captured work --------------------------------------------------------------------
    def _micro(self, batch: dict[str, Any]) -> None:
        """Forward, loss and backward of one micro-batch into the gradients; its loss parts into
        the accumulator. Nothing here reads a value on the host."""
        with self.acc.autocast():
            out = self.objective(self.model, batch)
        (out["loss"] * self.weight).backward()
        parts = _parts(out, self.objective)
        if self.keys is None:
            self.keys = tuple(parts)
            self.acc_parts = torch.zeros(len(self.keys), device=self.device)
        assert self.acc_parts is not None
        self.acc_parts.add_(torch.stack([parts[k] for k in self.keys]))

    def _update(self, params: Optional[list[torch.Tensor]] = None, optimizer: Any = None) -> None:
        """Clip, step, and zero the gradients in place (their memory is the graphs'); of the run's
        parameters and optimizer unless others are given (:meth:`_warm_update_kernels`)."""
        params, optimizer = params or self.params, optimizer or self.optimizer
        grads = [p.grad for p in params]
        if self.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        optimizer.step()
        torch._foreach_zero_(grads)

    # ---- before the first capture -------------------------------------------------------------
    def _prepare(self) -> None:
        """Gradients and the optimizer's state exist before any capture and are never reallocated;
        the learning rates are device tensors (a checkpoint's come back on the CPU)."""
        from finetune_cli.engine.setup import tensor_lr

        for group in self.optimizer.param_groups:
            group["lr"] = tensor_lr(group["lr"], self.device)
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad and not self.optimizer.state.get(p):
                    # What AdamW's first step would create (fused, capturable: the step count on the device).
                    self.optimizer.state[p] = {"step": torch.zeros((), dtype=torch.float32, device=p.device),
                                               "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                                               "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
        self._ready = True

    def _graph_for(self, batch: dict[str, Any], first: bool) -> tuple[Any, Any]:
        key = shape_key(batch)
        if key not in self.graphs:
            self.widths.add(int(batch["features"][0]["input_ids"].shape[1]))
            static = to_device(batch, self.device)
            self.graphs[key] = (self._capture_micro(static, first) if self.capture else None, static)
        return self.graphs[key]

    def _capture_micro(self, static: dict[str, Any], first: bool) -> Any:
        """Warm up on a side stream (lazy initialisations must not happen inside a capture), undo
        what the warm-up did (gradients, accumulated parts, the RNG), then capture. ``first``: the
        step's first micro-batch, whose gradients are all zero (the update graph zeroes them), so
        undoing the warm-up zeroes them again; a later one keeps a copy of them to restore (a
        gradient-sized allocation at the peak, only when a new width turns up mid-step)."""
        t0 = time.perf_counter()
        rng = torch.cuda.get_rng_state(self.device)
        grads = None if first else [p.grad.clone() for p in self.params]
        parts = self.acc_parts.clone() if self.acc_parts is not None else None

        def settle() -> None:
            if grads is None:
                torch._foreach_zero_([p.grad for p in self.params])
            else:
                torch._foreach_copy_([p.grad for p in self.params], grads)
            assert self.acc_parts is not None
            self.acc_parts.copy_(parts) if parts is not None else self.acc_parts.zero_()
            torch.cuda.set_rng_state(rng, self.device)

        graph, _ = capture_graph(lambda: self._micro(static), self.device, self.pool, settle=settle)
        self.pool = self.pool or graph.pool()
        torch.cuda.set_rng_state(rng, self.device)  # the capture drew nothing the replays will not draw
        self.capture_seconds += time.perf_counter() - t0
        return graph

    def _warm_update_kernels(self) -> None:
        """Launch the update's kernels once (the norm, clipping, the optimizer's step, zeroing) on a
        throwaway parameter before the update is captured: a kernel's first launch may load its module,
        which a capture does not allow. A warm-up of the real update would need a copy of the weights
        and the optimizer's state to undo it (three times the weights' memory at the peak)."""
        from finetune_cli.engine.setup import tensor_lr

        dummy = torch.nn.Parameter(torch.zeros(64, device=self.device))
        dummy.grad = torch.full_like(dummy, 0.5)
        takes = inspect.signature(type(self.optimizer)).parameters  # (defaults holds keys __init__ refuses)
        opt = type(self.optimizer)([dummy], **{k: v for k, v in self.optimizer.defaults.items()
                                               if k in takes and k != "lr"},
                                   lr=tensor_lr(self.optimizer.defaults["lr"], self.device))
        on_side_stream(lambda: self._update([dummy], opt), self.device)

    def _run_update(self) -> None:
        if not self.capture:
            self._update()
            return
        if self.update_graph is None:  # captured with no warm-up of its own: it changes the weights
            t0 = time.perf_counter()
            self._warm_update_kernels()
            self.update_graph, _ = capture_graph(self._update, self.device, self.pool, warmups=0)
            self.capture_seconds += time.perf_counter() - t0
        self.update_graph.replay()

    # ---- the step -----------------------------------------------------------------------------
    def __call__(self, stream: Iterator[Any], micro: list[list[int]], n_real: int) -> StepOut:
        """As :meth:`EagerStep.__call__` (one process: no padding micro-batches)."""
        if not self._ready:
            self._prepare()
        self.weight.fill_(1.0 / n_real)
        n_samples = 0
        for j, idx in enumerate(micro):
            batch = next(stream)
            graph, static = self._graph_for(batch, first=j == 0)
            copy_into(static, batch)
            if graph is None:
                self._micro(static)
            else:
                graph.replay()
            n_samples += len(idx)
        self._run_update()
        self.scheduler.step()  # writes the tensor learning rate in place, outside the graphs
        assert self.acc_parts is not None and self.keys is not None
        parts = self.acc_parts.clone()
        self.acc_parts.zero_()
        return n_samples, self.keys, parts
