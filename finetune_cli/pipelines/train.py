"""``finetune train``: recipe -> data -> model -> the engine -> a run directory.

Run directory layout: ``recipe.yaml`` (resolved), ``metrics.jsonl``, ``checkpoint-<step>/``,
``best/`` (best evaluation), ``final/`` (end of training), ``figures/curves.png`` (loss parts and
evaluation metrics against the step), ``tracking/`` (with ``train.report_to``), ``summary.json``.

Re-running the same recipe into the same directory resumes from its newest checkpoint (or does
nothing if the run is complete); a different recipe there is refused unless ``overwrite``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from finetune_cli import rundir
from finetune_cli.data.tasks import data_dir_from_env
from finetune_cli.engine import Interrupted, Trainer
from finetune_cli.engine.checkpoint_io import states_problem
from finetune_cli.engine.distributed import Processes, init_distributed
from finetune_cli.engine.inference import pad_id as pad_id_of
from finetune_cli.errors import RunDirError
from finetune_cli.fsutil import atomic_dir, atomic_write_json, atomic_write_text, check_writable_dir
from finetune_cli.models.loading import build_text_model, check_max_length, load_text_model, save_text_model
from finetune_cli.objectives import registry
from finetune_cli.pipelines.common import (
    EVALUATORS,
    encode,
    head_spec,
    label_type,
    load_data,
    model_card_info,
    objective_class,
)
from finetune_cli.recipe import Recipe


@dataclass
class TrainOutcome:
    run_dir: Path
    summary: dict[str, Any]
    resumed_from: Optional[Path] = None
    already_complete: bool = False


def run_train(recipe: Recipe, ui, *, device: str = "auto", data_dir: Optional[str] = None,
              resume: Optional[str] = None, overwrite: bool = False,
              callbacks: Sequence[Callable] = ()) -> TrainOutcome:
    """Train into ``recipe.run_dir``, holding its lock (the main process, for the whole run)."""
    recipe = registry.validate_recipe(recipe)
    procs = init_distributed(device)
    lock = procs.on_main(lambda: rundir.RunLock(recipe.run_dir).acquire())
    if lock is not None and lock.took_over:
        ui.log(f"taking over {lock.path}: its holder ({lock.took_over}) is no longer running")
    try:
        return _train_locked(recipe, ui, procs, device=device, data_dir=data_dir, resume=resume,
                             overwrite=overwrite, callbacks=callbacks)
    finally:
        if lock is not None:
            lock.release()


def _train_locked(recipe: Recipe, ui, procs: Processes, *, device: str, data_dir: Optional[str],
                  resume: Optional[str], overwrite: bool, callbacks: Sequence[Callable]) -> TrainOutcome:
    cls = objective_class(recipe)
    run_dir = recipe.run_dir
    # The main process checks that the directory is writable and holds this run (and with --overwrite
    # clears it); the others wait. (A write test on another rank raced with that check: its temp file
    # made the folder look "not empty", or vanished under --overwrite's deletion.)
    def check_output() -> None:
        check_writable_dir(run_dir, "output folder")
        rundir.check_run_dir(run_dir, recipe, overwrite, normalise=registry.validate_recipe)

    procs.on_main(check_output)
    summary = rundir.read_summary(run_dir)
    if summary is not None and resume is None:
        ui.log(f"run {run_dir} is already complete (summary.json); pass --overwrite to train again")
        return TrainOutcome(run_dir, summary, already_complete=True)

    data = load_data(recipe, cls, data_dir_from_env(data_dir), need_train=True)
    assert data.train is not None
    for note in data.notes:
        ui.warn(note)
    # After the data loaded: a data error is one line, not the recipe echo and then the error.
    ui.rule(f"finetune train · {recipe.objective.name} · {run_dir}")
    ui.log(recipe.to_yaml().rstrip())
    ui.log(f"data: {len(data.train)} train" + (f", {len(data.eval)} eval" if data.eval is not None else "")
           + (f"; labels: {', '.join(data.label_names)}" if data.label_names else ""))

    ck: Optional[Path] = None
    if resume:
        ck = Path(resume)
        why = rundir.checkpoint_problem(ck, states_problem) if ck.is_dir() else "not a directory"
        if why is not None:
            raise RunDirError(f"--resume {resume}: not a usable checkpoint ({why})")
    else:
        ck = rundir.intact_checkpoint(run_dir, ui.warn, verify=states_problem)

    run_dir.mkdir(parents=True, exist_ok=True)
    recipe_yaml = recipe.to_yaml()
    if procs.is_main:
        atomic_write_text(run_dir / rundir.RECIPE, recipe_yaml)

    # The model: from the checkpoint when resuming, else from model.name with fresh heads (seeded,
    # so that a seed fully determines a run).
    if ck is not None:
        model, tokenizer, _ = load_text_model(str(ck / rundir.CHECKPOINT_MODEL))
        ui.log(f"resuming from {ck}")
    else:
        from finetune_cli.engine.trainer import seed_everything

        model, tokenizer = build_text_model(
            recipe.model.name, lambda enc_dropout: head_spec(recipe, cls, data.num_labels, enc_dropout),
            revision=recipe.model.revision, dropout=recipe.model.dropout,
            before_heads=lambda: seed_everything(recipe.train.seed), reinit_layers=recipe.model.reinit_layers)
    check_max_length(model, recipe.model.max_length, "model.max_length", recipe.model.name)

    pad_id = pad_id_of(tokenizer)
    t0 = time.perf_counter()
    train_enc = encode(recipe, cls, data.train, tokenizer)
    eval_fn = EVALUATORS[cls.evaluation].build(recipe, cls, data, tokenizer, pad_id, data_dir_from_env(data_dir))
    ui.log(f"tokenised in {time.perf_counter() - t0:.1f}s (max_length {recipe.model.max_length})")

    objective = registry.build(recipe.objective.name, recipe.objective.params)
    id2label = data.id2label or None
    meta = {"objective": recipe.objective.name, "label_type": label_type(recipe, cls),
            "max_length": recipe.model.max_length}
    trainer: Optional[Trainer] = None

    def save_model(m, out: Path) -> None:
        st = trainer.state if trainer is not None else None
        card = model_card_info(recipe, cls, data, st)
        save_text_model(m, tokenizer, out, id2label=id2label, extra=meta, max_length=recipe.model.max_length,
                        card=card)

    sampler = cls.sampler
    if not recipe.data.group_by_length:
        from finetune_cli.data.sampling import UNGROUPED

        sampler = UNGROUPED.get(sampler, sampler)
    trainer = Trainer(model, objective, train_enc, recipe.train, run_dir, pad_id=pad_id, save_model=save_model,
                      evaluate=eval_fn, ui=ui, recipe_yaml=recipe_yaml, device=device, sampler=sampler,
                      callbacks=callbacks)
    try:
        result = trainer.train(resume_from=ck)
    except Interrupted as e:
        where = f"; checkpoint saved at {e.checkpoint}" if e.checkpoint else ""
        raise KeyboardInterrupt(f"interrupted{where}; rerun the same command to resume") from None

    if trainer.is_main:
        with atomic_dir(run_dir / rundir.FINAL) as tmp:
            save_model(trainer.unwrapped(), tmp)
    st = result.state
    summary = {
        "run_dir": str(run_dir),
        "objective": recipe.objective.name,
        "model": recipe.model.name,
        "steps": st.step,
        "total_steps": result.total_steps,
        "epochs_done": st.epoch,
        "train_examples": len(data.train),
        "eval_examples": len(data.eval) if data.eval is not None else 0,
        "samples_per_second": round(result.samples_per_second, 2),
        "train_seconds": round(st.train_seconds, 2),
        "device": result.device,
        "device_name": result.device_name,
        "gpu_mem_peak_gb": result.gpu_mem_peak_gb,
        "precision": result.precision,
        "metric": recipe.train.metric if eval_fn else None,
        "best_metric": st.best_metric,
        "best_step": st.best_step,
        "final_eval": st.last_eval,
        "stopped_early": st.stopped_early,
        "labels": data.label_names,
        "seed": recipe.train.seed,
    }
    if trainer.is_main:
        write_curves(run_dir, ui)
        atomic_write_json(run_dir / rundir.SUMMARY, summary)
    procs.barrier()  # no rank reports success before final/ and summary.json exist
    return TrainOutcome(run_dir, summary, resumed_from=ck)


def write_curves(run_dir: Path, ui) -> Optional[Path]:
    """``figures/curves.png`` from the run's ``metrics.jsonl`` (skipped without matplotlib)."""
    from finetune_cli.viz._mpl import available

    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        return None
    if not available():
        ui.warn("figures/curves.png skipped: matplotlib is not installed (pip install 'finetune-cli[plots]')")
        return None
    from finetune_cli.viz.curves import curve_series, plot_curves, read_metrics

    return plot_curves(curve_series(read_metrics(metrics)), run_dir / "figures" / "curves.png", title=str(run_dir))
