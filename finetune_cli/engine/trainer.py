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

import copy
import math
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from finetune_cli.checkpoint import Checkpointer
from finetune_cli.data.encode import EncodedData, collate, pin, prefetched, to_device
from finetune_cli.data.sampling import Padding, epoch_batches
from finetune_cli.engine import device_info, tracking
from finetune_cli.engine.device import GRAPH_MULTIPLE
from finetune_cli.engine.distributed import Processes, StopRequests, freeze_unused_parameters
from finetune_cli.engine.head_refit import refit_head
from finetune_cli.engine.inference import sharded
from finetune_cli.engine.rng import capture_rng, rank_seed, restore_rng, seed_everything
from finetune_cli.engine.setup import (
    build_optimizer,
    build_scheduler,
    check_trainable,
    eval_interval,
    make_accelerator,
    prepare_model,
    set_train_mode,
)
from finetune_cli.engine.state import Interrupted, TrainResult, TrainState
from finetune_cli.engine.step import EagerStep, GraphedStep, use_graphs
from finetune_cli.errors import TrainingError
from finetune_cli.fsutil import atomic_dir, atomic_write_json, clean_stale_temps
from finetune_cli.recipe import Recipe
from finetune_cli.rundir import BEST_METRICS, RunDir


@dataclass
class _Loop:
    """What one ``Trainer.train`` call carries from step to step; never saved (a resume rebuilds it
    from the checkpoint's ``TrainState``).

    ``rng_at_step_start`` is the RNG state the next step starts from: what a checkpoint written on
    an interrupt stores, so a resume replays the step that was cut short. ``pending``: the loss parts
    of the steps since the last host sync, still on the device (see ``Trainer._sync_losses``).
    ``window_samples``/``window_time``: samples and training seconds since the last log line. The
    step last checkpointed is the ``Checkpointer``'s to know."""

    eval_every: int
    save_every: int
    last_eval_step: int
    rng_at_step_start: dict[str, Any]
    pending: list[tuple[int, int, int, tuple[str, ...], torch.Tensor]] = field(default_factory=list)
    window_samples: int = 0
    window_time: float = 0.0


def _weighted(micro: list[list[int]]) -> int:
    """The micro-batches of a step that carry loss weight (not ``Padding``; at least 1): the loss of
    each is divided by this, as by the number of micro-batches in a step without padding."""
    return max(1, sum(not isinstance(idx, Padding) for idx in micro))


class Trainer:
    """Runs one training job into ``run_dir``.

    Args:
        model: a ``TextModel`` (already holding checkpoint weights when resuming).
        objective: an ``Objective``.
        train_data: tokenised training set.
        recipe: the validated recipe (its ``train`` section drives the loop; stored in every checkpoint).
        run: the run folder: its checkpoints (a ``Checkpointer``), metrics log and models.
        procs: this process's view of the run (``engine.distributed.init_distributed``, resolved once).
        save_model: ``save_model(model, out_dir)`` writes a loadable model folder.
        evaluate: ``evaluate(model) -> {metric: value}`` on the evaluation set, or None.
        sampler: name of the batch sampler (``Objective.sampler``, or ``random`` when
            ``data.group_by_length`` is off).
        callbacks: ``cb(trainer, state)`` after each optimizer step (tests use it to interrupt).
        prefetch: build the next batch in a background thread while the current one trains
            (same batches either way; off only to compare).
    """

    def __init__(self, model, objective, train_data: EncodedData, recipe: Recipe, run: RunDir, procs: Processes, *,
                 pad_id: int, save_model: Callable[[Any, Path], None],
                 evaluate: Optional[Callable[[Any], dict[str, float]]], ui, sampler: str = "length_grouped",
                 callbacks: Sequence[Callable[[Trainer, TrainState], None]] = (), prefetch: bool = True):
        self.recipe, self.cfg, self.run, self.ui = recipe, recipe.train, run, ui
        cfg = self.cfg
        self.checkpoints = Checkpointer(run, keep=cfg.keep_checkpoints)
        self.prefetch = prefetch
        self.train_data, self.pad_id = train_data, pad_id
        self.save_model_fn, self.evaluate_fn = save_model, evaluate
        self.sampler, self.callbacks = sampler, list(callbacks)
        self.procs = procs
        self.graphs = use_graphs(cfg, procs.device, procs.world, objective, ui.log)
        self.acc = make_accelerator(self.procs.device, cfg.precision, self.graphs,
                                    **tracking.accelerator_kwargs(cfg.report_to, run.path))
        self.device_name = device_info.describe(self.acc.device)
        self.rank, self.world = self.procs.rank, self.procs.world
        self.steps_per_epoch, self.total_steps = self._count_steps()
        self.trainable = check_trainable(model, cfg, evaluated=evaluate is not None, log=ui.log)
        opt = build_optimizer(model, cfg, self.acc.device, graphs=self.graphs)
        self.pad_multiple, self.max_width = prepare_model(model, cfg, int(train_data.lengths.max()))
        if self.graphs:  # a handful of widths, a handful of graphs
            self.pad_multiple, self.max_width = GRAPH_MULTIPLE, recipe.model.max_length
        self.scheduler = build_scheduler(opt, cfg, self.total_steps)
        self.objective = objective.to(self.acc.device)
        self.frozen = self._freeze_unused(model)
        self.model, self.optimizer = self.acc.prepare(model, opt)
        self.stepper = (GraphedStep(self.acc, self.model, self.objective, self.optimizer, self.scheduler, cfg.max_grad_norm,
                                    capture=self.acc.device.type == "cuda") if self.graphs else
                        EagerStep(self.acc, self.model, self.objective, self.optimizer, self.scheduler, cfg.max_grad_norm,
                                  self.world))
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
        """Write this step's checkpoint (the main process; the others wait): the model, the engine's
        states, every rank's RNG state (``rng``: this rank's, by default its current one)."""
        rngs = self.procs.gather_to_main(rng or capture_rng())  # every rank's own stream
        if self.is_main:
            assert rngs is not None
            states = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}
            if self.acc.scaler is not None:
                states["scaler"] = self.acc.scaler.state_dict()
            self.checkpoints.write(self.state.step, save_model=lambda d: self.save_model_fn(self.unwrapped(), d),
                                   states=states, rngs=rngs, recipe_yaml=self.recipe.to_yaml(),
                                   trainer_state=asdict(self.state))
        self.acc.wait_for_everyone()
        self.checkpoints.last_written = self.state.step  # on every rank: later saves are skipped by all or none
        return self.checkpoints.path(self.state.step)

    def load_checkpoint(self, ck: Path) -> None:
        """Restore optimizer, scheduler, state and RNG (the model was loaded from the checkpoint)."""
        got = self.checkpoints.read(ck, self.rank)
        self.optimizer.load_state_dict(got.states["optimizer"])
        self.scheduler.load_state_dict(got.states["scheduler"])
        if self.acc.scaler is not None and "scaler" in got.states:
            self.acc.scaler.load_state_dict(got.states["scaler"])
        self.state = TrainState(**got.trainer_state)
        self._resume_rng = got.rng
        if self.is_main:  # what was logged after the checkpoint is logged again
            self.run.metrics.truncate(self.state.step, drop_eval=self.state.eval_pending)

    def _log_metrics(self, record: dict[str, Any]) -> None:
        if self.is_main:
            self.run.metrics.append(record)
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
        better = st.record_eval(metrics, self.cfg.metric, self.metric_greater, self.cfg.early_stopping_patience)
        if better and self.is_main:
            with atomic_dir(self.run.best) as tmp:
                self.save_model_fn(self.unwrapped(), tmp)
                atomic_write_json(tmp / BEST_METRICS, {"step": st.step, **metrics})
        self._log_metrics({"step": st.step, "epoch": self._epoch_at(), **{f"eval/{k}": v for k, v in metrics.items()}})
        shown = "  ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        progress.log(f"eval @ step {st.step}: {shown}{'  (best)' if better else ''}")
        return metrics

    def _epoch_at(self) -> float:
        """Where the run stands, in epochs (fractional, as the training records say)."""
        st = self.state
        return round(st.epoch + st.batch_in_epoch / len(self._epoch_batches(st.epoch)), 4)

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
        return self.checkpoints.written(self.state.step) or self.save_checkpoint(rng=loop.rng_at_step_start)

    # ---- the loop -----------------------------------------------------------------------------
    def _batch_stream(self, pool: ThreadPoolExecutor, batches: list[list[int]], start: int) -> Iterator[Any]:
        """Collated batches ``batches[start:]`` (in page-locked memory on CUDA), built a step ahead."""
        on_cuda = self.acc.device.type == "cuda"

        def build(idx: list[int]):
            b = collate(self.train_data, idx, self.pad_id, self.pad_multiple, self.max_width)
            return pin(b) if on_cuda else b

        return prefetched(build, batches[start:], pool if self.prefetch else None)

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
                good = self.checkpoints.last_good(step)
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
                "effective batch), lower model.max_length"
                + (", or set train.cuda_graphs=off (a captured step keeps its gradients for the whole run)"
                   if self.graphs else " or set train.gradient_checkpointing=true")) from None
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
        self.run.path.mkdir(parents=True, exist_ok=True)
        # The main process alone removes leftovers of interrupted atomic writes, and everyone waits:
        # a slower rank cleaning here deleted the main's temp file of the metrics log it was just
        # truncating for the resume (ENOENT at the rename; a rare flake of the kill-9 resume test).
        self.procs.on_main(lambda: clean_stale_temps(self.run.path))
        if resume_from is not None:
            self.load_checkpoint(resume_from)
        self._seed(resume_from)
        if resume_from is None and self.is_main:  # a run that died before its first checkpoint: its log starts afresh
            self.run.metrics.reset()
        tracking.start(self.acc, cfg.report_to, self.run.path, self.recipe.to_dict(), resuming=resume_from is not None)
        device_info.reset_peak(self.acc.device)
        set_train_mode(self.model, cfg.freeze_encoder)
        eval_every = eval_interval(cfg, self.steps_per_epoch, self.total_steps)
        done = self.state.step if resume_from is not None else -1  # the checkpoint's step is evaluated and saved
        self.checkpoints.last_written = done if resume_from is not None else None
        return _Loop(eval_every=eval_every, save_every=cfg.save_every or eval_every, last_eval_step=done,
                     rng_at_step_start=capture_rng())

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
            n_samples, keys, parts = self.stepper(stream, micro, n_weighted)
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
        rec = {"step": st.step, "epoch": epoch_at, "lr": float(self.scheduler.get_last_lr()[0]),
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

    def _agree_stop(self) -> None:
        """Stop after this step when any rank was asked to (every rank stops after the same step)."""
        if self.stop.agreed():
            raise KeyboardInterrupt

    def _final_evaluate_and_save(self, loop: _Loop, progress) -> None:
        """After the last step: evaluate and checkpoint it unless the cadence just did."""
        self._sync_losses(loop)
        if self.state.step != loop.last_eval_step:
            self._evaluate_step(progress)
        if self.checkpoints.written(self.state.step) is None:
            self.save_checkpoint()

    def _finish(self) -> TrainResult:
        st = self.state
        sps = st.samples_seen / st.train_seconds if st.train_seconds > 0 else 0.0
        mem = device_info.memory(self.acc.device)
        return TrainResult(st, self.total_steps, str(self.acc.device), self.acc.mixed_precision, sps,
                           device_name=self.device_name, gpu_mem_peak_gb=mem["gpu_mem_peak_gb"] if mem else None,
                           num_processes=self.world, trainable_params=self.trainable,
                           cuda_graphs=self.stepper.summary() if isinstance(self.stepper, GraphedStep) else None)
