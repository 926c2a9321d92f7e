"""``finetune train``: recipe -> data -> model -> the engine -> a run directory.

Run directory layout: ``recipe.yaml`` (resolved), ``metrics.jsonl``, ``checkpoint-<step>/``,
``best/`` (best evaluation), ``final/`` (end of training), ``figures/curves.png`` (loss parts and
evaluation metrics against the step), ``tracking/`` (with ``train.report_to``), ``summary.json``.

Re-running the same recipe into the same directory resumes from its newest checkpoint (or does
nothing if the run is complete); a different recipe there is refused unless ``overwrite``.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml

from finetune_cli.data.tasks import data_dir_from_env
from finetune_cli.engine import Interrupted, Trainer, list_checkpoints
from finetune_cli.errors import RunDirError
from finetune_cli.fsutil import atomic_dir, atomic_write_json, atomic_write_text
from finetune_cli.models.loading import load_text_model, save_text_model
from finetune_cli.objectives import registry
from finetune_cli.pipelines.common import EVALUATORS, encode, head_spec, load_data, objective_class
from finetune_cli.recipe import Recipe, RecipeError, build_recipe


@dataclass
class TrainOutcome:
    run_dir: Path
    summary: dict[str, Any]
    resumed_from: Optional[Path] = None
    already_complete: bool = False


def _check_run_dir(recipe: Recipe, run_dir: Path, overwrite: bool) -> Optional[dict]:
    """Return the stored recipe dict if ``run_dir`` holds this same run; refuse a different one."""
    stored = run_dir / "recipe.yaml"
    if not run_dir.exists() or not any(run_dir.iterdir()):
        return None
    if overwrite:
        shutil.rmtree(run_dir)
        return None
    if not stored.is_file():
        raise RunDirError(f"output directory {run_dir} is not empty and holds no finetune run; "
                          f"choose another output.name or pass --overwrite")
    try:
        old = build_recipe(yaml.safe_load(stored.read_text()) or {}, str(stored))
    except Exception:
        raise RunDirError(f"output directory {run_dir} holds a run whose recipe.yaml cannot be read; "
                          f"pass --overwrite to replace it") from None
    if old.fingerprint() != recipe.fingerprint():
        diff = _first_difference(old.to_dict(), recipe.to_dict())
        raise RunDirError(f"output directory {run_dir} holds a different run ({diff}); "
                          f"pass --overwrite to replace it, or set output.name")
    return old.to_dict()


def _first_difference(a: Any, b: Any, prefix: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if k == "output":
                continue
            if a.get(k) != b.get(k):
                return _first_difference(a.get(k), b.get(k), f"{prefix}.{k}" if prefix else k)
    return f"{prefix}: {a!r} there, {b!r} now"


def run_train(recipe: Recipe, ui, *, device: str = "auto", data_dir: Optional[str] = None,
              resume: Optional[str] = None, overwrite: bool = False,
              callbacks: Sequence[Callable] = ()) -> TrainOutcome:
    if not isinstance(recipe, Recipe):
        raise RecipeError(f"{recipe.source} is a probe recipe; run it with `finetune probe sequential` (or generalization, retention)")
    cls = objective_class(recipe)
    run_dir = recipe.run_dir
    _check_run_dir(recipe, run_dir, overwrite)
    summary_file = run_dir / "summary.json"
    if summary_file.is_file() and resume is None:
        import json

        ui.log(f"run {run_dir} is already complete (summary.json); pass --overwrite to train again")
        return TrainOutcome(run_dir, json.loads(summary_file.read_text()), already_complete=True)

    ui.rule(f"finetune train · {recipe.objective.name} · {run_dir}")
    ui.log(recipe.to_yaml().rstrip())
    data = load_data(recipe, cls, data_dir_from_env(data_dir), need_train=True)
    assert data.train is not None
    ui.log(f"data: {len(data.train)} train" + (f", {len(data.eval)} eval" if data.eval is not None else "")
           + (f"; labels: {', '.join(data.label_names)}" if data.label_names else ""))

    ck: Optional[Path] = None
    if resume:
        ck = Path(resume)
        if not (ck / "trainer_state.json").is_file():
            raise RunDirError(f"--resume {resume}: not a checkpoint directory (no trainer_state.json)")
    else:
        cks = list_checkpoints(run_dir)
        ck = cks[-1] if cks else None

    run_dir.mkdir(parents=True, exist_ok=True)
    recipe_yaml = recipe.to_yaml()
    atomic_write_text(run_dir / "recipe.yaml", recipe_yaml)

    # Build the model: from the checkpoint when resuming, else from model.name with fresh heads.
    from finetune_cli.models.loading import load_encoder, resolve_model

    if ck is not None:
        model, tokenizer, _ = load_text_model(str(ck / "model"))
        ui.log(f"resuming from {ck}")
    else:
        from finetune_cli.models.loading import load_tokenizer
        from finetune_cli.models.text_model import TextModel

        path, is_local = resolve_model(recipe.model.name)
        rev = None if is_local else recipe.model.revision
        tokenizer = load_tokenizer(path, rev)
        encoder = load_encoder(path, rev)
        if recipe.model.dropout is not None:
            from finetune_cli.models.text_model import set_encoder_dropout

            set_encoder_dropout(encoder, recipe.model.dropout)
        spec = head_spec(recipe, cls, data.num_labels, float(getattr(encoder.config, "hidden_dropout_prob", 0.1)))
        # Seed before the heads are initialised so that a seed fully determines a run.
        from finetune_cli.engine.trainer import seed_everything

        seed_everything(recipe.train.seed)
        model = TextModel(encoder, spec)

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    t0 = time.perf_counter()
    train_enc = encode(recipe, cls, data.train, tokenizer)
    eval_fn = EVALUATORS[cls.evaluation].build(recipe, cls, data, tokenizer, pad_id, data_dir_from_env(data_dir))
    ui.log(f"tokenised in {time.perf_counter() - t0:.1f}s (max_length {recipe.model.max_length})")

    objective = registry.build(recipe.objective.name, recipe.objective.params)
    id2label = data.id2label or None
    meta = {"objective": recipe.objective.name, "label_type": cls.label_type}

    def save_model(m, out: Path) -> None:
        save_text_model(m, tokenizer, out, id2label=id2label, extra=meta, max_length=recipe.model.max_length)

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
        with atomic_dir(run_dir / "final") as tmp:
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
        atomic_write_json(run_dir / "summary.json", summary)
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
