"""The one training loop, for every objective.

What it does: device placement and mixed precision through ``accelerate`` (so ``accelerate
launch`` / ``torchrun`` run it on many processes unchanged), the optimizer and learning-rate
schedule the recipe names (torch ``AdamW``/``SGD``, transformers' ``Adafactor`` and
``get_scheduler``), gradient checkpointing, accumulation and clipping, evaluation every N steps,
early stopping, the best checkpoint by a chosen metric, atomic checkpoints and exact resume,
progress and ``metrics.jsonl``.

What it does not do: compute a loss. It calls ``objective(model, batch)`` and reads ``"loss"`` and
the objective's declared ``parts``; it never looks at which objective it runs.

Exact resume: a checkpoint holds the model, optimizer, scheduler, every RNG state (one per process,
``rng-<rank>``) and the data position (epoch, batches consumed). Batches of an epoch are a pure
function of (seed, epoch), and no DataLoader iterator draws from the global RNG, so a resumed run
replays the same batches with the same dropout masks and ends with the same weights as a run that
never stopped.

Several processes (``torchrun``, ``accelerate launch``; see ``engine/distributed.py``): each rank has
its own seed stream and RNG state; the main process alone prints and writes; a stop request
(SIGINT/SIGTERM on any rank) is agreed on at every step boundary, so all ranks stop after the
same step; evaluation is split over the ranks.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from finetune_cli.data.encode import EncodedData, collate, pin, to_device
from finetune_cli.data.sampling import Padding, epoch_batches
from finetune_cli.engine import device_info, tracking
from finetune_cli.engine.checkpoint_io import has_state, load_state, save_state
from finetune_cli.engine.device import resolve_precision
from finetune_cli.engine.distributed import StopRequests, freeze_unused_parameters, init_distributed
from finetune_cli.engine.head_refit import refit_head, refit_target
from finetune_cli.engine.inference import sharded
from finetune_cli.engine.rng import capture_rng, rank_seed, restore_rng, seed_everything
from finetune_cli.errors import ModelError, TrainingError
from finetune_cli.fsutil import atomic_dir, atomic_write_json, atomic_write_text, clean_stale_temps
from finetune_cli.models.text_model import enable_gradient_checkpointing, parameter_counts
from finetune_cli.objectives._dist import left_out
from finetune_cli.recipe import TrainConfig
from finetune_cli.rundir import BEST_METRICS, CHECKPOINT_MODEL, CHECKPOINT_RECIPE, STATE_FILE, RunDir
from finetune_cli.ui import launched_world_size


@dataclass
class TrainState:
    step: int = 0  # optimizer steps done
    epoch: int = 0  # epoch the next batch comes from
    batch_in_epoch: int = 0  # batches of that epoch already trained on
    samples_seen: int = 0
    train_seconds: float = 0.0
    best_metric: Optional[float] = None
    best_step: Optional[int] = None
    evals_without_improvement: int = 0
    last_eval: dict[str, float] = field(default_factory=dict)
    stopped_early: bool = False
    # An evaluation was under way when the run was interrupted: a resume runs it first, so the
    # metrics (and best/, early stopping) are those of a run that never stopped.
    eval_pending: bool = False
    # Loss sums since the last log line, so a resumed run logs the same averages.
    log_window: dict[str, float] = field(default_factory=dict)
    log_window_steps: int = 0


@dataclass
class TrainResult:
    state: TrainState
    total_steps: int
    device: str
    precision: str
    samples_per_second: float
    device_name: str = ""  # e.g. "cuda:0 NVIDIA H100 80GB HBM3" or "cpu ×2 threads"
    gpu_mem_peak_gb: Optional[float] = None  # CUDA only
    num_processes: int = 1
    trainable_params: int = 0  # parameters the optimizer updates (LoRA: the adapters and the head)


@dataclass
class _Loop:
    """What one ``Trainer.train`` call carries from step to step; never saved (a resume rebuilds it
    from the checkpoint's ``TrainState``).

    ``rng_at_step_start`` is the RNG state the next step starts from: what a checkpoint written on
    an interrupt stores, so a resume replays the step that was cut short. ``pending``: the loss parts
    of the steps since the last host sync, still on the device (see ``Trainer._sync_losses``).
    ``window_samples``/``window_time``: samples and training seconds since the last log line."""

    eval_every: int
    save_every: int
    last_eval_step: int
    last_save_step: int
    rng_at_step_start: dict[str, Any]
    pending: list[tuple[int, int, int, tuple[str, ...], torch.Tensor]] = field(default_factory=list)
    window_samples: int = 0
    window_time: float = 0.0


class Interrupted(Exception):
    """Raised after a Ctrl-C / SIGTERM checkpoint has been written."""

    def __init__(self, checkpoint: Optional[Path]):
        super().__init__(str(checkpoint))
        self.checkpoint = checkpoint


# ---- device -----------------------------------------------------------------------------------

def make_accelerator(dev: torch.device, precision: str, **tracking_kwargs):
    """``dev``: the resolved device (``Processes.device``). ``precision``: auto (bf16 on a GPU that
    has it) | fp32 | bf16 | fp16 (fp16 uses a gradient scaler; GPU only). ``tracking_kwargs``:
    ``log_with`` and ``project_dir`` for experiment trackers (see ``engine.tracking``)."""
    from accelerate import Accelerator

    if dev.type == "cuda" and dev.index is not None and launched_world_size() == 1:
        torch.cuda.set_device(dev)
    use_cpu = dev.type == "cpu"
    # accelerate keeps one process-wide state and refuses a second Accelerator with other settings;
    # a single-process caller (tests, multi-seed runs, probe stages) may train several times with
    # different devices or precisions, so start each run from a clean state. Under a launcher
    # (WORLD_SIZE > 1) the distributed state must stay.
    if launched_world_size() == 1:
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)
    prec = resolve_precision(precision, dev, "train.precision", TrainingError)
    mp = "no" if prec == "fp32" else prec  # accelerate's name for no mixed precision
    return Accelerator(cpu=use_cpu, mixed_precision=mp, **tracking_kwargs)


def _weighted(micro: list[list[int]]) -> int:
    """The micro-batches of a step that carry loss weight (not ``Padding``; at least 1): the loss of
    each is divided by this, as by the number of micro-batches in a step without padding."""
    return max(1, sum(not isinstance(idx, Padding) for idx in micro))


ENCODER_PREFIX = "encoder."


def freeze_encoder(model: torch.nn.Module) -> int:
    """Stop gradients into the encoder (``train.freeze_encoder``): only the heads train. Returns the
    number of parameters frozen. Features are then a fixed function of the input, so no autograd
    graph is built through the encoder and a step costs one forward pass of it."""
    n = 0
    for name, p in model.named_parameters():
        if name.startswith(ENCODER_PREFIX):
            p.requires_grad_(False)
            n += p.numel()
    return n


def set_train_mode(model: torch.nn.Module, frozen_encoder: bool) -> None:
    """``model.train()``, except that a frozen encoder stays in eval mode: frozen *features* are the
    point of head-only training (with dropout on, every epoch would see different features)."""
    model.train()
    if frozen_encoder:
        for name, m in model.named_modules():  # "encoder", or "module.encoder" under DDP
            if name + "." == ENCODER_PREFIX or name.endswith("." + ENCODER_PREFIX[:-1]):
                m.eval()


def _param_groups(model: torch.nn.Module, cfg: TrainConfig) -> list[dict[str, Any]]:
    """No weight decay on biases and norms (BERT's recipe); the new heads may get their own lr.
    Frozen parameters (``requires_grad`` off, e.g. ``train.freeze_encoder``) are left out."""
    groups: dict[tuple[bool, bool], list[torch.nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        no_decay = p.ndim < 2 or "LayerNorm" in name or "layer_norm" in name or name.endswith(".bias")
        head = not name.startswith(ENCODER_PREFIX)
        groups.setdefault((no_decay, head), []).append(p)
    out = []
    for (no_decay, head), params in sorted(groups.items()):
        out.append({"params": params, "weight_decay": 0.0 if no_decay else cfg.weight_decay,
                    "lr": (cfg.head_lr or cfg.lr) if head else cfg.lr})
    return out


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig, device_type: str) -> torch.optim.Optimizer:
    """``train.optimizer`` over the parameter groups of :func:`_param_groups`, at ``train.lr``."""
    groups = _param_groups(model, cfg)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr)
    if cfg.optimizer == "adafactor":
        from transformers.optimization import Adafactor

        # A fixed learning rate (train.lr and the schedule), as transformers' Trainer sets it up.
        return Adafactor(groups, lr=cfg.lr, scale_parameter=False, relative_step=False, warmup_init=False)
    # Fused AdamW (CPU and CUDA): one kernel for the whole update instead of a few per tensor;
    # on the CPU it is several times faster than the per-tensor loop.
    fused = device_type in ("cpu", "cuda") if cfg.optimizer == "adamw_fused" else False
    return torch.optim.AdamW(groups, lr=cfg.lr, fused=fused or None)


def build_scheduler(opt: torch.optim.Optimizer, cfg: TrainConfig, total_steps: int):
    """``train.lr_scheduler`` from transformers' ``get_scheduler`` (its ``linear`` is
    ``get_linear_schedule_with_warmup``); ``train.warmup_steps`` when set, else ``warmup_ratio``."""
    from transformers import get_scheduler

    warmup = cfg.warmup_steps if cfg.warmup_steps is not None else int(cfg.warmup_ratio * total_steps)
    return get_scheduler(cfg.lr_scheduler, opt, num_warmup_steps=warmup, num_training_steps=total_steps)


def eval_interval(cfg: TrainConfig, steps_per_epoch: int, total_steps: int) -> int:
    """Steps between evaluations. ``min_evals`` ties the cadence to the step budget: without
    ``eval_every`` the run evaluates every ``total_steps // min_evals`` steps instead of once per
    epoch (a 40-example epoch is 3 steps: per-epoch evaluation would dominate the run), and an
    ``eval_every`` longer than that is shortened (a few-shot run can be shorter than
    ``eval_every``), so ``best/`` and early stopping act in every run."""
    if not cfg.min_evals:
        return cfg.eval_every or steps_per_epoch
    every = max(1, total_steps // cfg.min_evals)
    return min(cfg.eval_every, every) if cfg.eval_every else every


class Trainer:
    """Runs one training job into ``run_dir``.

    Args:
        model: a ``TextModel`` (already holding checkpoint weights when resuming).
        objective: an ``Objective``.
        train_data: tokenised training set.
        cfg: the recipe's ``train`` section.
        run_dir: where checkpoints, ``metrics.jsonl`` and models go.
        save_model: ``save_model(model, out_dir)`` writes a loadable model folder.
        evaluate: ``evaluate(model) -> {metric: value}`` on the evaluation set, or None.
        sampler: name of the batch sampler (``Objective.sampler``, or ``random`` when
            ``data.group_by_length`` is off).
        callbacks: ``cb(trainer, state)`` after each optimizer step (tests use it to interrupt).
        prefetch: build the next batch in a background thread while the current one trains
            (same batches either way; off only to compare).
    """

    def __init__(self, model, objective, train_data: EncodedData, cfg: TrainConfig, run_dir: Path, *, pad_id: int,
                 save_model: Callable[[Any, Path], None], evaluate: Optional[Callable[[Any], dict[str, float]]],
                 ui, recipe_yaml: str, device: str = "auto", sampler: str = "length_grouped",
                 callbacks: Sequence[Callable[[Trainer, TrainState], None]] = (), prefetch: bool = True):
        self.cfg, self.run_dir, self.ui = cfg, Path(run_dir), ui
        self.run = RunDir(self.run_dir)
        self.prefetch = prefetch
        self.train_data, self.pad_id = train_data, pad_id
        self.save_model_fn, self.evaluate_fn = save_model, evaluate
        self.recipe_yaml, self.sampler, self.callbacks = recipe_yaml, sampler, list(callbacks)
        self.procs = init_distributed(device)
        self.acc = make_accelerator(self.procs.device, cfg.precision,
                                    **tracking.accelerator_kwargs(cfg.report_to, self.run_dir))
        self.device_name = device_info.describe(self.acc.device)
        self.rank, self.world = self.procs.rank, self.procs.world
        self.steps_per_epoch, self.total_steps = self._count_steps()
        self._check_trainable(model)
        opt = build_optimizer(model, cfg, self.acc.device.type)
        if cfg.gradient_checkpointing:
            try:
                enable_gradient_checkpointing(model)
            except ValueError as e:
                raise ModelError(f"train.gradient_checkpointing: {e}; set it to false") from None
        self._setup_compile(model)
        self.scheduler = build_scheduler(opt, cfg, self.total_steps)
        self.objective = objective.to(self.acc.device)
        self.frozen = self._freeze_unused(model)
        self.model, self.optimizer = self.acc.prepare(model, opt)
        self.metric_greater = cfg.greater_is_better if cfg.greater_is_better is not None else (
            "loss" not in cfg.metric)
        self.state = TrainState()
        self.stop = StopRequests(self.procs)

    def _count_steps(self) -> tuple[int, int]:
        """Optimizer steps per epoch (this rank's batches of an epoch over ``grad_accum``) and the
        step budget of the run."""
        cfg = self.cfg
        per_epoch = math.ceil(len(self._epoch_batches(0)) / cfg.grad_accum)
        if per_epoch == 0:
            raise TrainingError(f"training set of {len(self.train_data)} examples gives no full step with batch size "
                                f"{cfg.batch_size} on {self.world} processes")
        return per_epoch, cfg.max_steps or max(math.ceil(cfg.epochs * per_epoch), cfg.min_steps or 0)

    def _epoch_batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches of ``epoch`` (indices into the training set), from the recipe's sampler."""
        data, cfg = self.train_data, self.cfg
        return epoch_batches(self.sampler, data.lengths, data.labels, cfg.batch_size, cfg.seed, epoch,
                             self.rank, self.world)

    def _check_trainable(self, model) -> None:
        """Freeze the encoder when the recipe asks (``train.freeze_encoder``), then refuse a job that
        cannot train: nothing left to train, or a head refit without an evaluation set."""
        cfg = self.cfg
        if cfg.freeze_encoder and freeze_encoder(model) == 0:
            raise TrainingError(f"train.freeze_encoder: the model has no `{ENCODER_PREFIX}*` parameters to freeze")
        if cfg.refit_head:
            refit_target(model)  # a model with no head to refit fails here, not at the first evaluation
            if self.evaluate_fn is None:
                raise TrainingError("train.refit_head refits the head before each evaluation: give the run an "
                                    "evaluation set (data.eval_split or data.eval)")
        self.trainable, total = parameter_counts(model)
        if not self.trainable:
            raise TrainingError("nothing to train: train.freeze_encoder is on and the model has no head "
                                "(use a classification objective)")
        self.ui.log(f"trainable parameters: {self.trainable:,} of {total:,} ({100 * self.trainable / total:.2f}%)")

    def _setup_compile(self, model) -> None:
        """``train.compile``: compile the encoder and set the batch widths it will see."""
        # Widths are rounded up to multiples of 16 (never past the longest example), so
        # torch.compile sees a handful of shapes, not one per batch width.
        self.pad_multiple, self.max_width = (16, int(self.train_data.lengths.max())) if self.cfg.compile else (1, None)
        if self.cfg.compile:
            # Module.compile() compiles in place: parameter names, saving and DDP wrapping are unchanged.
            (model.encoder if hasattr(model, "encoder") else model).compile()

    def _freeze_unused(self, model) -> list[str]:
        """Before DDP wraps the model: freeze what no loss trains (see ``freeze_unused_parameters``)
        and say so; returns the names frozen. The optimizer was built first, so its layout (and a
        checkpoint's) is the same for any number of processes."""
        # Whenever DDP will wrap the model: also one process under torchrun (accelerate then joins a
        # process group of one and wraps the model all the same).
        if not (self.world > 1 or (torch.distributed.is_available() and torch.distributed.is_initialized())):
            return []
        model.to(self.acc.device)
        idx = self._epoch_batches(0)[0]

        def probe():
            with self.acc.autocast():
                return self.objective(model, to_device(collate(self.train_data, idx, self.pad_id), self.acc.device))["loss"]

        frozen = freeze_unused_parameters(model, probe, self.procs)
        if frozen:
            self.ui.log(f"not trained (no loss uses them; DDP would wait for them): {', '.join(frozen)}")
        return frozen

    # ---- checkpoints --------------------------------------------------------------------------
    @property
    def is_main(self) -> bool:
        """The process that prints and writes (``Processes.is_main``: the launcher's rank 0)."""
        return self.procs.is_main

    def unwrapped(self):
        return self.acc.unwrap_model(self.model)

    def save_checkpoint(self, rng: Optional[dict[str, Any]] = None) -> Path:
        """Write ``checkpoint-<step>/`` atomically (a temp dir renamed into place), then prune."""
        target = self.run.checkpoint(self.state.step)
        rngs = self.procs.gather_to_main(rng or capture_rng())  # every rank's own stream
        if self.is_main:
            with atomic_dir(target) as tmp:
                self.save_model_fn(self.unwrapped(), tmp / CHECKPOINT_MODEL)
                # No pickle: these files are read back on resume (see engine/checkpoint_io.py).
                save_state(self.optimizer.state_dict(), tmp, "optimizer")
                save_state(self.scheduler.state_dict(), tmp, "scheduler")
                if self.acc.scaler is not None:
                    save_state(self.acc.scaler.state_dict(), tmp, "scaler")
                for r, rank_rng in enumerate(rngs):
                    save_state(rank_rng, tmp, f"rng-{r}")
                (tmp / CHECKPOINT_RECIPE).write_text(self.recipe_yaml)
                (tmp / STATE_FILE).write_text(json.dumps(asdict(self.state), indent=2))
            self.run.prune(keep=self.cfg.keep_checkpoints, protect=self.state.step)
        self.acc.wait_for_everyone()
        return target

    def load_checkpoint(self, ck: Path) -> None:
        """Restore optimizer, scheduler, state and RNG (the model was loaded from ``ck/model``)."""
        self.optimizer.load_state_dict(load_state(ck, "optimizer"))
        self.scheduler.load_state_dict(load_state(ck, "scheduler"))
        if self.acc.scaler is not None and has_state(ck, "scaler"):
            self.acc.scaler.load_state_dict(load_state(ck, "scaler"))
        self.state = TrainState(**json.loads((ck / STATE_FILE).read_text()))
        self._resume_rng = self._checkpoint_rng(ck)
        self._truncate_metrics(self.state.step, drop_eval=self.state.eval_pending)

    def _checkpoint_rng(self, ck: Path) -> Optional[dict[str, Any]]:
        """This rank's RNG state, ``rng-<rank>``. A rank the checkpoint has no state for (it was
        written by fewer processes) gets None: a fresh stream, and the resume is not exact (the
        batches differ anyway)."""
        return load_state(ck, f"rng-{self.rank}") if has_state(ck, f"rng-{self.rank}") else None

    def _truncate_metrics(self, step: int, drop_eval: bool = False) -> None:
        """Drop metric lines logged after the checkpoint we resume from (they will be logged again),
        and its own evaluation line when that evaluation is to be rerun (``drop_eval``)."""
        f = self.run.metrics_file
        if not (self.is_main and f.is_file()):
            return

        def keep_line(rec: dict) -> bool:
            at = rec.get("step", 0)
            return at < step or (at == step and not (drop_eval and any(k.startswith("eval/") for k in rec)))

        keep = []
        for ln in f.read_text(encoding="utf-8", errors="replace").splitlines():
            try:  # a line torn by a crash mid-write (or any garbage) is dropped
                rec = json.loads(ln)
            except ValueError:
                continue
            if isinstance(rec, dict) and keep_line(rec):
                keep.append(ln)
        atomic_write_text(f, "".join(ln + "\n" for ln in keep))

    def _log_metrics(self, record: dict[str, Any]) -> None:
        if self.is_main:
            with (self.run.metrics_file).open("a") as f:
                f.write(json.dumps(record) + "\n")
        tracking.log(self.acc, record)

    # ---- evaluation ---------------------------------------------------------------------------
    def _evaluate(self, progress) -> Optional[dict[str, float]]:
        if self.evaluate_fn is None:
            return None
        model = self.unwrapped()
        refit: dict[str, float] = {}
        if self.cfg.refit_head:  # outside autocast and no_grad: the fit is float64 L-BFGS
            with sharded(self.procs):
                refit = refit_head(model, self.train_data, self.cfg.eval_batch_size, self.pad_id, self.procs)
        model.eval()
        with torch.no_grad(), self.acc.autocast(), sharded(self.procs):
            metrics = {**self.evaluate_fn(model), **refit}
        set_train_mode(self.model, self.cfg.freeze_encoder)
        # Every rank computed the same numbers from the same gathered outputs; take the main
        # process's anyway, so best-checkpoint and early-stopping decisions cannot diverge.
        metrics = self.procs.broadcast(metrics)
        if self.cfg.metric not in metrics:
            raise TrainingError(f"train.metric `{self.cfg.metric}` is not computed here (have: {', '.join(metrics)})")
        st = self.state
        st.last_eval = metrics
        value = metrics[self.cfg.metric]
        better = st.best_metric is None or (value > st.best_metric if self.metric_greater else value < st.best_metric)
        if better:
            st.best_metric, st.best_step, st.evals_without_improvement = value, st.step, 0
            if self.is_main:
                with atomic_dir(self.run.best) as tmp:
                    self.save_model_fn(self.unwrapped(), tmp)
                    atomic_write_json(tmp / BEST_METRICS, {"step": st.step, **metrics})
        else:
            st.evals_without_improvement += 1
        self._log_metrics({"step": st.step, "epoch": st.epoch, **{f"eval/{k}": v for k, v in metrics.items()}})
        shown = "  ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        progress.log(f"eval @ step {st.step}: {shown}{'  (best)' if better else ''}")
        pat = self.cfg.early_stopping_patience
        if pat is not None and st.evals_without_improvement >= pat:
            st.stopped_early = True
        return metrics

    def _evaluate_step(self, progress) -> None:
        """Evaluate at this step; if interrupted, leave the state as it was before the evaluation
        began (with ``eval_pending``) so the checkpoint written on the way out reruns it whole."""
        before = copy.deepcopy(self.state)
        try:
            self._evaluate(progress)
        except KeyboardInterrupt:
            before.eval_pending = True
            self.state = before
            raise
        except torch.cuda.OutOfMemoryError:  # its own batch size, so its own line (the step's is in train)
            raise TrainingError(
                f"out of memory on {self.device_name} in the evaluation after step {self.state.step} with "
                f"train.eval_batch_size={self.cfg.eval_batch_size}: lower train.eval_batch_size or "
                "model.max_length") from None
        self.state.eval_pending = False

    def _interrupt_checkpoint(self, loop: _Loop) -> Optional[Path]:
        """The checkpoint of a stopped run: the weights of the last completed step with the RNG state
        the next step starts from (written once, unless the regular save just wrote it)."""
        if self.state.step == 0:
            return None
        if self.state.step == loop.last_save_step:
            return self.run.checkpoint(self.state.step)
        return self.save_checkpoint(rng=loop.rng_at_step_start)

    # ---- the loop -----------------------------------------------------------------------------
    def _batch_stream(self, pool: ThreadPoolExecutor, batches: list[list[int]], start: int) -> Iterator[Any]:
        """Collated batches ``batches[start:]`` in order, each built one step ahead on ``pool``
        (in page-locked memory on CUDA) while the current one trains. ``collate`` draws no random
        numbers, so the batches and the RNG stream are those of a loop without prefetch."""
        on_cuda = self.acc.device.type == "cuda"

        def build(idx: list[int]):
            b = collate(self.train_data, idx, self.pad_id, self.pad_multiple, self.max_width)
            return pin(b) if on_cuda else b

        if not self.prefetch:
            yield from (build(idx) for idx in batches[start:])
            return
        nxt = pool.submit(build, batches[start]) if start < len(batches) else None
        for k in range(start, len(batches)):
            assert nxt is not None
            b = nxt.result()
            nxt = pool.submit(build, batches[k + 1]) if k + 1 < len(batches) else None
            yield b

    def _sync_losses(self, loop: _Loop) -> float:
        """Read the loss parts of the steps since the last sync (one host transfer), check them
        in order and add them to the log window. Raises on the first non-finite loss, naming its
        step; no checkpoint or evaluation happens between that step and this check. Returns the
        seconds spent waiting for the device."""
        pending, loop.pending = loop.pending, []
        if not pending:
            return 0.0
        t0 = time.perf_counter()
        flat = torch.cat([p[4] for p in pending]).tolist()
        waited = time.perf_counter() - t0
        st, pos = self.state, 0
        for step, epoch, n_micro, keys, _ in pending:
            host = dict(zip(keys, flat[pos:pos + len(keys)], strict=True))
            pos += len(keys)
            if not math.isfinite(host["loss"]):
                good = self.run.last_good_checkpoint(step)
                raise TrainingError(
                    f"loss is {host['loss'] / n_micro} at step {step} (epoch {epoch + 1}); stopped. "
                    f"Last good checkpoint: {good or 'none'}")
            for k, v in host.items():
                st.log_window[k] = st.log_window.get(k, 0.0) + v / n_micro
            st.log_window_steps += 1
        return waited

    def train(self, resume_from: Optional[Path] = None) -> TrainResult:
        """Train to the step budget (or until early stopping), from scratch or from the checkpoint
        ``resume_from``. A stop request (Ctrl-C, SIGTERM) writes a checkpoint and raises
        :class:`Interrupted`."""
        loop = self._start(resume_from)
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="finetune-collate")
        try:
            with self.stop.installed(), self.ui.progress(self.total_steps, f"train · {self.device_name}") as progress:
                progress.log(f"training on {self.device_name} ({self.acc.mixed_precision} mixed precision, "
                             f"{self.world} process{'es' if self.world > 1 else ''})")
                progress.update(self.state.step)
                if self.state.eval_pending:  # interrupted during this step's evaluation: finish it first
                    self._evaluate_step(progress)
                    self.save_checkpoint(rng=loop.rng_at_step_start)
                epoch = self.state.epoch
                while self._steps_left():
                    epoch = self._run_epoch(loop, pool, progress, epoch)
                self._final_evaluate_and_save(loop, progress)
        except torch.cuda.OutOfMemoryError:  # = torch.OutOfMemoryError; this name on every torch >= 2.2
            # One line instead of the allocator's page; the last checkpoint written stays intact.
            raise TrainingError(
                f"out of memory on {self.device_name} at step {self.state.step + 1} with train.batch_size="
                f"{self.cfg.batch_size}: lower train.batch_size (raise train.grad_accum to keep the "
                "effective batch), lower model.max_length or set train.gradient_checkpointing=true") from None
        except KeyboardInterrupt:
            # Model weights are those of the last completed step; save them with the RNG state
            # from the start of the step that was cut short, so a resume replays it exactly.
            self._sync_losses(loop)
            raise Interrupted(self._interrupt_checkpoint(loop)) from None
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            tracking.finish(self.acc)
        return self._finish()

    def _start(self, resume_from: Optional[Path]) -> _Loop:
        """Everything before the first step: sweep stale temp files, load the checkpoint, seed,
        start the log and the trackers; returns the loop's starting state."""
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # The main process alone removes leftovers of interrupted atomic writes, and everyone waits:
        # a slower rank cleaning here deleted the main's temp file of the metrics log it was just
        # truncating for the resume (ENOENT at the rename; a rare flake of the kill-9 resume test).
        self.procs.on_main(lambda: clean_stale_temps(self.run_dir))
        if resume_from is not None:
            self.load_checkpoint(resume_from)
        self._seed(resume_from)
        if resume_from is None and self.is_main:  # a run that died before its first checkpoint: its log starts afresh
            (self.run.metrics_file).unlink(missing_ok=True)
        import yaml

        tracking.start(self.acc, cfg.report_to, self.run_dir, yaml.safe_load(self.recipe_yaml) or {},
                       resuming=resume_from is not None)
        device_info.reset_peak(self.acc.device)
        set_train_mode(self.model, cfg.freeze_encoder)
        eval_every = eval_interval(cfg, self.steps_per_epoch, self.total_steps)
        done = self.state.step if resume_from is not None else -1  # the checkpoint's step is evaluated and saved
        return _Loop(eval_every=eval_every, save_every=cfg.save_every or eval_every, last_eval_step=done,
                     last_save_step=done, rng_at_step_start=capture_rng())

    def _seed(self, resume_from: Optional[Path]) -> None:
        """Each rank's random stream: restored from the checkpoint, else seeded per rank."""
        rng = self._resume_rng if resume_from is not None else None
        if rng is not None:
            restore_rng(rng)
        else:
            seed_everything(rank_seed(self.cfg.seed, self.rank) + (self.state.step if resume_from else 0))

    def _steps_left(self) -> bool:
        return self.state.step < self.total_steps and not self.state.stopped_early

    def _run_epoch(self, loop: _Loop, pool: ThreadPoolExecutor, progress, epoch: int) -> int:
        """Train on ``epoch``'s batches from where the state stands until the epoch ends, the step
        budget is spent or early stopping ends the run; returns the epoch the next batch comes from."""
        cfg, st = self.cfg, self.state
        batches = self._epoch_batches(epoch)
        i = st.batch_in_epoch if epoch == st.epoch else 0
        stream = self._batch_stream(pool, batches, i)
        while i < len(batches) and self._steps_left():
            t0 = time.perf_counter()
            micro = batches[i:i + cfg.grad_accum]
            n_weighted = _weighted(micro)
            n_samples, keys, parts = self._step(stream, micro, n_weighted)
            i += len(micro)
            st.step += 1
            st.epoch, st.batch_in_epoch = epoch, i
            loop.pending.append((st.step, epoch, n_weighted, keys, parts))
            # Nothing until the next step draws random numbers (evaluation and saving do not), so
            # this is the RNG state the next step starts from.
            loop.rng_at_step_start = capture_rng()
            st.samples_seen += n_samples * self.world
            dt = time.perf_counter() - t0
            st.train_seconds += dt
            loop.window_samples += n_samples * self.world
            loop.window_time += dt
            self._log_line(loop, progress, round(epoch + i / len(batches), 4))
            self._evaluate_and_save(loop, progress)
            for cb in self.callbacks:
                cb(self, st)
            self._agree_stop()
        if i >= len(batches):
            epoch += 1
            st.epoch, st.batch_in_epoch = epoch, 0
        return epoch

    def _step(self, stream: Iterator[Any], micro: list[list[int]], n_real: int,
              ) -> tuple[int, tuple[str, ...], torch.Tensor]:
        """One optimizer step over the micro-batches ``micro`` (gradient accumulation; the gradients
        are synchronised on the last one only; each loss divided by ``n_real``, the :func:`_weighted`
        count of ``micro``), with clipping and the scheduler's step. Returns the
        examples trained on, the names of the loss parts and their sums over the micro-batches,
        left on the device: no host sync per step keeps the GPU fed."""
        parts_sum: dict[str, torch.Tensor] = {}
        n_samples = 0
        for j, idx in enumerate(micro):
            batch = to_device(next(stream), self.acc.device)
            sync = j == len(micro) - 1
            ctx = self.acc.no_sync(self.model) if not sync and self.world > 1 else contextlib.nullcontext()
            pad = isinstance(idx, Padding)  # zero weight, and out of the batch gathered across processes
            with ctx, self.acc.autocast(), left_out(pad):
                out = self.objective(self.model, batch)
            self.acc.backward(out["loss"] * 0.0 if pad else out["loss"] / n_real)
            for k in ("loss", *self.objective.parts):
                if k in out:
                    v = out[k].detach().float() * 0.0 if pad else out[k].detach().float()
                    parts_sum[k] = parts_sum[k] + v if k in parts_sum else v
            n_samples += 0 if pad else len(idx)
        keys = tuple(parts_sum)
        parts = torch.stack([parts_sum[k] for k in keys])
        if self.cfg.max_grad_norm is not None:
            self.acc.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return n_samples, keys, parts

    def _log_line(self, loop: _Loop, progress, epoch_at: float) -> None:
        """At a log step (``train.log_every``, and the last step): the window's averages into
        ``metrics.jsonl`` and a progress line, then a new window. Otherwise only the bar moves."""
        st = self.state
        if not (st.step % self.cfg.log_every == 0 or st.step == self.total_steps):
            progress.update(st.step)
            return
        # On a GPU the steps since the last sync may still be queued: the wait for them is
        # training time.
        wait = self._sync_losses(loop)
        st.train_seconds += wait
        loop.window_time += wait
        el = loop.window_time  # training time only: evaluation and saving excluded
        rec = {"step": st.step, "epoch": epoch_at, "lr": self.scheduler.get_last_lr()[0],
               **{k: v / st.log_window_steps for k, v in st.log_window.items()},
               "samples_per_s": loop.window_samples / el if el > 0 else None}
        mem = device_info.memory(self.acc.device)
        rec.update(mem or {})
        self._log_metrics(rec)
        info = f"loss {rec['loss']:.4f}  lr {rec['lr']:.2e}  {rec['samples_per_s'] or 0:.1f} sent/s"
        if mem:
            info += "  " + device_info.memory_text(mem)
        progress.update(st.step, info, force_line=True)
        st.log_window, st.log_window_steps = {}, 0
        loop.window_samples, loop.window_time = 0, 0.0

    def _evaluate_and_save(self, loop: _Loop, progress) -> None:
        """The cadence: evaluate every ``eval_every`` steps, checkpoint every ``save_every`` (and
        when early stopping ends the run), both at the last step."""
        st = self.state
        do_eval = st.step % loop.eval_every == 0 or st.step == self.total_steps
        do_save = st.step % loop.save_every == 0 or st.step == self.total_steps
        if do_eval:
            st.train_seconds += self._sync_losses(loop)  # never evaluate weights after a NaN
            self._evaluate_step(progress)
            loop.last_eval_step = st.step
        if do_save or st.stopped_early:
            st.train_seconds += self._sync_losses(loop)  # never checkpoint weights after a NaN
            self.save_checkpoint()
            loop.last_save_step = st.step

    def _agree_stop(self) -> None:
        """Stop after this step when any rank was asked to (every rank stops after the same step)."""
        if self.stop.agreed():
            raise KeyboardInterrupt

    def _final_evaluate_and_save(self, loop: _Loop, progress) -> None:
        """After the last step: evaluate and checkpoint it unless the cadence just did."""
        self._sync_losses(loop)
        if self.state.step != loop.last_eval_step:
            self._evaluate_step(progress)
        if self.state.step != loop.last_save_step:
            self.save_checkpoint()

    def _finish(self) -> TrainResult:
        st = self.state
        sps = st.samples_seen / st.train_seconds if st.train_seconds > 0 else 0.0
        mem = device_info.memory(self.acc.device)
        return TrainResult(st, self.total_steps, str(self.acc.device), self.acc.mixed_precision, sps,
                           device_name=self.device_name, gpu_mem_peak_gb=mem["gpu_mem_peak_gb"] if mem else None,
                           num_processes=self.world, trainable_params=self.trainable)
