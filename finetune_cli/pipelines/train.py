"""``finetune train``: a plan -> data -> model -> the engine -> a run directory.

Three steps (torchtune's recipe shape): **setup** (claim the output folder, read the data, find the
checkpoint to resume from, build the model and the trainer), **train** (the engine's one loop),
**finish** (``final/``, the curves, ``summary.json``).

Re-running the same recipe into the same folder resumes (or does nothing if the run is complete);
a different recipe there is refused unless ``overwrite``, and ``--resume`` of another job's checkpoint.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from finetune_cli.checkpoint import Checkpointer
from finetune_cli.data import TaskData
from finetune_cli.data.tasks import data_dir_from_env
from finetune_cli.engine import Interrupted, Trainer
from finetune_cli.engine.device import resolve_device, resolve_precision
from finetune_cli.engine.distributed import Processes, init_distributed, refuse_sharding
from finetune_cli.engine.inference import pad_id
from finetune_cli.engine.rng import seed_everything
from finetune_cli.engine.setup import warmup_note
from finetune_cli.errors import TrainingError
from finetune_cli.fsutil import atomic_dir, atomic_write_json, atomic_write_text, check_writable_dir
from finetune_cli.inputs import check_output_apart
from finetune_cli.models.loading import build_text_model, check_max_length, load_text_model, save_text_model
from finetune_cli.pipelines.common import EVALUATORS, attach_label_texts, encode, load_data, model_card_info
from finetune_cli.pipelines.push import push_after_training
from finetune_cli.pipelines.recipes import Plan, comparable
from finetune_cli.rundir import RunDir, RunLock, same_run
from finetune_cli.viz.curves import write_curves


@dataclass
class TrainOutcome:
    run_dir: Path
    summary: dict[str, Any]
    resumed_from: Optional[Path] = None
    already_complete: bool = False


def run_train(plan: Plan, ui, *, device: str = "auto", data_dir: Optional[str] = None,
              resume: Optional[str] = None, overwrite: bool = False,
              callbacks: Sequence[Callable] = ()) -> TrainOutcome:
    """Train into ``plan.run_dir``, holding its lock (the main process, for the whole run)."""
    check_output_apart(plan.run_dir, plan.recipe)  # before the lock file is made there
    procs = init_distributed(device)
    lock = procs.on_main(lambda: RunLock(plan.run_dir).acquire())
    if lock is not None and lock.took_over:
        ui.log(f"taking over {lock.path}: its holder ({lock.took_over}) is no longer running")
    try:
        run = RunDir(plan.run_dir)
        # The main process checks that the folder is writable and holds this run (with --overwrite
        # clears it); the others wait (a write test on another rank raced with that check).
        procs.on_main(lambda: _claim_output(run, plan, overwrite))
        summary = run.read_summary()
        if summary is not None and resume is None:
            ui.log(f"run {run} is already complete (summary.json); pass --overwrite to train again")
            return TrainOutcome(run.path, summary, already_complete=True)
        trainer, data, ck = _setup(plan, run, ui, procs, data_dir=data_dir_from_env(data_dir), resume=resume,
                                   callbacks=callbacks)
        result = _train(trainer, ck)
        return TrainOutcome(run.path, _finish(plan, run, trainer, data, result, procs, ui), resumed_from=ck)
    finally:
        if lock is not None:
            lock.release()


def preflight(plan: Plan, *, device: str = "auto", data_dir: Optional[str] = None) -> None:
    """What ``--nproc N`` checks in its own process before it starts N (its recipe is validated): an
    accelerate config that shards, the device and precision, the data; so these are one line."""
    refuse_sharding()
    check_output_apart(plan.run_dir, plan.recipe)
    resolve_precision(plan.recipe.train.precision, resolve_device(device), "train.precision", TrainingError)
    load_data(plan, data_dir_from_env(data_dir), need_train=True)


# ---- setup -------------------------------------------------------------------------------------

def _claim_output(run: RunDir, plan: Plan, overwrite: bool) -> None:
    check_writable_dir(run.path, "output folder")
    run.claim(comparable(plan.recipe), overwrite, normalise=comparable)


def _setup(plan: Plan, run: RunDir, ui, procs: Processes, *, data_dir: Optional[Path], resume: Optional[str],
           callbacks: Sequence[Callable]) -> tuple[Trainer, TaskData, Optional[Path]]:
    data = _setup_data(plan, data_dir, ui)
    ck = Checkpointer(run).resume_point(resume, ui.warn, lambda ck_run, where: same_run(
        where, comparable(ck_run.read_recipe()), comparable(plan.recipe),
        "resume a checkpoint of this recipe, or train without --resume"))
    run.path.mkdir(parents=True, exist_ok=True)
    if procs.is_main:
        run.record_split(data.split, resuming=ck is not None)
        atomic_write_text(run.recipe_file, plan.recipe.to_yaml())
    model, tokenizer = _setup_model(plan, ck, data, ui)
    trainer = _setup_trainer(plan, run, data, model, tokenizer, ui, procs, data_dir=data_dir, callbacks=callbacks)
    return trainer, data, ck


def _setup_data(plan: Plan, data_dir: Optional[Path], ui) -> TaskData:
    data = load_data(plan, data_dir, need_train=True)
    assert data.train is not None
    for note in data.notes:
        ui.warn(note)
    # After the data loaded: a data error is one line, not the recipe echo and then the error.
    ui.rule(f"finetune train · {plan.objective_name} · {plan.run_dir}")
    ui.log(plan.recipe.to_yaml().rstrip())
    ui.log(f"data: {len(data.train)} train" + (f", {len(data.eval)} eval" if data.eval is not None else "")
           + (f"; labels: {', '.join(data.label_names)}" if data.label_names else ""))
    return data


def _setup_model(plan: Plan, ck: Optional[Path], data: TaskData, ui):
    """From the checkpoint when resuming, else ``model.name`` with fresh heads (seeded, so that a
    seed fully determines a run)."""
    m = plan.recipe.model
    if ck is not None:
        model, tokenizer, _ = load_text_model(str(Checkpointer.model(ck)))
        ui.log(f"resuming from {ck}")
    else:
        model, tokenizer = build_text_model(
            m.name, lambda enc_dropout: plan.head_spec(data.num_labels, enc_dropout), revision=m.revision,
            dropout=m.dropout, before_heads=lambda: seed_everything(plan.recipe.train.seed),
            reinit_layers=m.reinit_layers, lora=m.lora)
    check_max_length(model, m.max_length, "model.max_length", m.name)
    attach_label_texts(plan, model, tokenizer, data.label_names)
    return model, tokenizer


def _setup_trainer(plan: Plan, run: RunDir, data: TaskData, model, tokenizer, ui, procs: Processes, *,
                   data_dir: Optional[Path], callbacks: Sequence[Callable]) -> Trainer:
    recipe = plan.recipe
    pid = pad_id(tokenizer)
    t0 = time.perf_counter()
    train_enc = encode(plan, data.train, tokenizer, ui)
    eval_fn = EVALUATORS[plan.evaluation].build(plan, data, tokenizer, pid, data_dir, ui=ui)
    ui.log(f"tokenised in {time.perf_counter() - t0:.1f}s (max_length {recipe.model.max_length})")
    meta = {"objective": plan.objective_name, "label_type": plan.label_type,
            **{k: getattr(recipe.model, k) for k in ("max_length", "truncation")}}
    # weakly held: trainer -> save_model -> trainer would keep the run in (device) memory after it ends
    trainer_ref: Optional[weakref.ref[Trainer]] = None

    def save_model(m, out: Path) -> None:
        st = t.state if trainer_ref is not None and (t := trainer_ref()) is not None else None
        save_text_model(m, tokenizer, out, id2label=data.id2label or None, extra=meta,
                        max_length=recipe.model.max_length, card=model_card_info(plan, data, st))

    trainer = Trainer(model, plan.build_objective(train_enc.labels, data.num_labels), train_enc, recipe, run, procs,
                      pad_id=pid, save_model=save_model, evaluate=eval_fn, ui=ui, sampler=plan.sampler,
                      callbacks=callbacks)
    trainer_ref = weakref.ref(trainer)
    if (note := warmup_note(recipe.train, trainer.total_steps)) is not None:
        ui.warn(note)
    return trainer


def _train(trainer: Trainer, ck: Optional[Path]):  # the engine's one loop
    try:
        return trainer.train(resume_from=ck)
    except Interrupted as e:
        where = f"; checkpoint saved at {e.checkpoint}" if e.checkpoint else ""
        raise KeyboardInterrupt(f"interrupted{where}; rerun the same command to resume") from None


def _finish(plan: Plan, run: RunDir, trainer: Trainer, data: TaskData, result, procs: Processes, ui) -> dict:
    """``final/``, the curves and ``summary.json`` (written last: the run is complete)."""
    if trainer.is_main:
        with atomic_dir(run.final) as tmp:
            trainer.save_model_fn(trainer.unwrapped(), tmp)
    summary = _summary(plan, run, data, result, evaluated=trainer.evaluate_fn is not None)
    if trainer.is_main:
        write_curves(run, ui)  # figures/curves.png
        atomic_write_json(run.summary_file, summary)
        push_after_training(run.path, plan.recipe.output, ui, summary)  # (the run is complete whatever it does)
    procs.barrier()  # no rank reports success before final/ and summary.json exist
    return summary


def _summary(plan: Plan, run: RunDir, data: TaskData, result, evaluated: bool) -> dict[str, Any]:
    st, recipe = result.state, plan.recipe
    assert data.train is not None
    return {
        "run_dir": str(run), "objective": plan.objective_name, "model": recipe.model.name,
        "steps": st.step, "total_steps": result.total_steps, "epochs_done": st.epoch,
        "train_examples": len(data.train), "eval_examples": len(data.eval) if data.eval is not None else 0,
        "samples_per_second": round(result.samples_per_second, 2), "train_seconds": round(st.train_seconds, 2),
        "trainable_params": result.trainable_params,
        "device": result.device, "device_name": result.device_name, "gpu_mem_peak_gb": result.gpu_mem_peak_gb,
        "precision": result.precision, "metric": recipe.train.metric if evaluated else None,
        "best_metric": st.best_metric, "best_step": st.best_step, "final_eval": st.last_eval,
        "stopped_early": st.stopped_early, "labels": data.label_names, "seed": recipe.train.seed,
        "num_processes": result.num_processes, "cuda_graphs": result.cuda_graphs,
    }

