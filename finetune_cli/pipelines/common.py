"""Pieces the pipelines share: a plan's data read and encoded, the evaluation training runs, what
a model card says about a run."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from finetune_cli.data import EncodedData, TaskData, encode_table, load_task_data
from finetune_cli.engine.evaluation import make_classifier_eval, make_similarity_eval
from finetune_cli.pipelines.recipes import Plan
from finetune_cli.recipe import Recipe


def warn_long_warmup(trainer, ui):
    """``train.warmup_steps`` beyond the run's last step: the learning rate never reaches
    ``train.lr``. A warning, not a refusal: a short trial run of a long recipe is a fair thing to do.
    Returns ``trainer``."""
    cfg, total = trainer.cfg, trainer.total_steps
    if cfg.warmup_steps is not None and cfg.warmup_steps > total:
        ui.warn(f"train.warmup_steps {cfg.warmup_steps} is more than the run's {total} steps: the learning rate "
                f"never reaches train.lr (it ends at {total / cfg.warmup_steps:.0%} of it); lower "
                f"train.warmup_steps, or set train.warmup_ratio instead")
    return trainer


def load_data(plan: Plan, data_dir: Optional[Path], need_train: bool = True, need_eval: bool = False,
              data: Optional[Any] = None) -> TaskData:
    """The plan's training and/or evaluation data, read with the objective's contract (``data``:
    another data section to read instead of the recipe's, e.g. with the model's own label names)."""
    recipe, cls = plan.recipe, plan.objective_cls
    cfg = data if data is not None else recipe.data
    if EVALUATORS[plan.evaluation].own_data:  # the evaluator reads data.eval with its own columns
        cfg = dataclasses.replace(cfg, eval=None)
    required = tuple(cls.required_columns)
    if cfg.nli_triplets:
        from finetune_cli.data.nli import nli_triplets
        from finetune_cli.data.tasks import subsample

        # Triplets are built from whole premise groups, so sub-sampling applies to the triplets.
        raw = load_task_data(dataclasses.replace(cfg, max_train_samples=None), seed=recipe.train.seed,
                             label_type=None, required_columns=("text", "text_pair", "label"),
                             data_dir=data_dir, need_train=need_train, need_eval=False)
        train = nli_triplets(raw.train) if raw.train is not None else None
        if train is not None and cfg.max_train_samples:
            train = subsample(train, cfg.max_train_samples, cfg.seed if cfg.seed is not None else recipe.train.seed)
        return TaskData(train, None, None, None)
    lt = plan.label_type
    return load_task_data(cfg, seed=recipe.train.seed, label_type=lt,
                          required_columns=required, data_dir=data_dir,
                          need_train=need_train, need_eval=need_eval, min_classes=cls.min_classes if
                          lt == "class" else 1)


def encode(plan: Plan, table, tokenizer) -> EncodedData:
    return encode_table(table, tokenizer, plan.recipe.model.max_length, plan.text_columns, joint=plan.joint)


def load_similarity_data(recipe: Recipe, data_dir: Optional[Path]):
    """The sentence-pair evaluation set (``text``, ``text_pair``, float gold ``label``) named by
    ``data.eval`` (or ``data.dataset``'s eval split), read with ``data.eval_columns``."""
    d = recipe.data
    cfg = dataclasses.replace(d, train=None, few_shot=None, max_train_samples=None, nli_triplets=False)
    if cfg.eval is None and cfg.dataset is None:
        return None
    return load_task_data(cfg, seed=recipe.train.seed, label_type="float",
                          required_columns=("text", "text_pair", "label"), data_dir=data_dir,
                          need_train=False, need_eval=True).eval


def _classifier_evaluator(plan: Plan, data: TaskData, tokenizer, pad_id: int, data_dir):
    cls, recipe = plan.objective_cls, plan.recipe
    if data.eval is None or not cls.needs_classifier or cls.label_type is None:
        return None
    return make_classifier_eval(encode(plan, data.eval, tokenizer), plan.label_type,
                                recipe.train.eval_batch_size, pad_id, recipe.model.threshold)


def _similarity_evaluator(plan: Plan, data: TaskData, tokenizer, pad_id: int, data_dir):
    recipe = plan.recipe
    table = load_similarity_data(recipe, data_dir)
    if table is None:
        return None
    return make_similarity_eval(table, tokenizer, recipe.model.max_length, recipe.train.eval_batch_size, pad_id)


@dataclass(frozen=True)
class Evaluator:
    """How training is evaluated, chosen by the objective's ``evaluation`` attribute.

    ``build(plan, data, tokenizer, pad_id, data_dir) -> evaluate(model) | None``;
    ``own_data``: it reads ``data.eval`` itself, so the objective's contract does not apply to it.
    """

    build: Callable[..., Optional[Callable[[Any], dict[str, float]]]]
    own_data: bool = False


EVALUATORS: dict[str, Evaluator] = {
    "classifier": Evaluator(_classifier_evaluator),
    "similarity": Evaluator(_similarity_evaluator, own_data=True),
}


def training_log(run_dir: Path, upto: int, current: Optional[dict] = None) -> list[dict[str, Any]]:
    """The rows of a model card's training log: one per evaluation up to step ``upto``, with the
    latest training loss logged by then (``metrics.jsonl``, in the run folder), and the evaluation
    at ``upto`` itself (``current``: ``best/`` is written before its evaluation is logged)."""
    from finetune_cli.rundir import RunDir

    f, rows, loss = RunDir(run_dir).metrics_file, [], None
    for line in f.read_text(encoding="utf-8").splitlines() if f.is_file() else ():
        rec = json.loads(line)
        if rec.get("step", 0) > upto:
            break
        if "loss" in rec:
            loss = rec["loss"]
        if any(k.startswith("eval/") for k in rec):
            rows.append({"step": rec["step"], "epoch": rec.get("epoch"), "train_loss": loss,
                         **{k[5:]: v for k, v in rec.items() if k.startswith("eval/")}})
    if current and (not rows or rows[-1]["step"] < upto):
        rows.append({"step": upto, "epoch": None, "train_loss": loss, **current})
    return rows


def model_card_info(plan: Plan, data: TaskData, state) -> dict[str, Any]:
    """What a saved folder's model card says about the run (``models/card.py`` renders it)."""
    recipe = plan.recipe
    step = state.step if state is not None else 0
    loss = plan.objective_cls.describe(plan.problem_type)
    return {"recipe": recipe.to_dict(), "objective": plan.objective_name, "loss": loss,
            "params": {k: v for k, v in plan.params.items() if k not in loss["unused"]},
            "train_examples": len(data.train) if data.train is not None else 0,
            "eval_examples": len(data.eval) if data.eval is not None else 0, "labels": data.label_names,
            "step": step, "eval": dict(state.last_eval) if state is not None else {},
            "log": training_log(plan.run_dir, step, state.last_eval if state is not None else None),
            "metric": recipe.train.metric, "best_metric": getattr(state, "best_metric", None),
            "best_step": getattr(state, "best_step", None)}
