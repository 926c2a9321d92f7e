"""Pieces the pipelines share: the objective's data contract applied to a recipe, model heads,
evaluation functions."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from finetune_cli.data import EncodedData, TaskData, encode_table, load_task_data
from finetune_cli.engine.evaluation import make_classifier_eval, make_similarity_eval
from finetune_cli.models.text_model import HeadSpec
from finetune_cli.objectives import registry
from finetune_cli.recipe import Recipe


def objective_class(recipe: Recipe):
    return registry.get(recipe.objective.name)


def text_columns(cls) -> tuple[str, ...]:
    """Text columns in the order the objective encodes them (label and other non-text columns
    excluded)."""
    cols = [c for c in cls.required_columns if c != "label"]
    if cls.encoding == "joint" and "text_pair" not in cols:
        cols.append("text_pair")
    return tuple(cols)


def label_type(recipe: Recipe, cls) -> Optional[str]:
    """How labels are read: the objective's label type, or the problem type's (regression,
    multi-label) for a classifier."""
    return registry.label_type(cls, registry.resolve_problem_type(recipe, cls))


def head_spec(recipe: Recipe, cls, num_labels: int, encoder_dropout: float) -> HeadSpec:
    dropout = recipe.model.classifier_dropout
    problem = registry.resolve_problem_type(recipe, cls) or "single_label_classification"
    return HeadSpec(
        pooling=recipe.model.pooling,
        num_labels=(1 if problem == "regression" else num_labels) if cls.needs_classifier else 0,
        classifier_dropout=encoder_dropout if dropout is None else dropout,
        spectral_norm=cls.spectral_norm_head,
        projection=cls.needs_projection if recipe.model.projection is None else recipe.model.projection,
        problem_type=problem, head=recipe.model.head, threshold=recipe.model.threshold,
        normalize=recipe.model.head_normalize,
    )


def load_data(recipe: Recipe, cls, data_dir: Optional[Path], need_train: bool = True,
              need_eval: bool = False) -> TaskData:
    cfg = recipe.data
    if EVALUATORS[cls.evaluation].own_data:  # the evaluator reads data.eval with its own columns
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
    lt = label_type(recipe, cls)
    return load_task_data(cfg, seed=recipe.train.seed, label_type=lt,
                          required_columns=required, data_dir=data_dir,
                          need_train=need_train, need_eval=need_eval, min_classes=cls.min_classes if
                          lt == "class" else 1)


def encode(recipe: Recipe, cls, table, tokenizer) -> EncodedData:
    return encode_table(table, tokenizer, recipe.model.max_length, text_columns(cls), joint=cls.encoding == "joint")


def load_similarity_data(recipe: Recipe, data_dir: Optional[Path]):
    """The sentence-pair evaluation set (``text``, ``text_pair``, float gold ``label``) named by
    ``data.eval`` (or ``data.dataset``'s eval split), read with ``data.eval_columns``."""
    d = recipe.data
    cfg = dataclasses.replace(d, train=None, columns=d.eval_columns or d.columns, few_shot=None,
                              max_train_samples=None, nli_triplets=False)
    if cfg.eval is None and cfg.dataset is None:
        return None
    return load_task_data(cfg, seed=recipe.train.seed, label_type="float",
                          required_columns=("text", "text_pair", "label"), data_dir=data_dir,
                          need_train=False, need_eval=True).eval


def _classifier_evaluator(recipe: Recipe, cls, data: TaskData, tokenizer, pad_id: int, data_dir):
    if data.eval is None or not cls.needs_classifier or cls.label_type is None:
        return None
    return make_classifier_eval(encode(recipe, cls, data.eval, tokenizer), label_type(recipe, cls),
                                recipe.train.eval_batch_size, pad_id, recipe.model.threshold)


def _similarity_evaluator(recipe: Recipe, cls, data: TaskData, tokenizer, pad_id: int, data_dir):
    table = load_similarity_data(recipe, data_dir)
    if table is None:
        return None
    return make_similarity_eval(table, tokenizer, recipe.model.max_length, recipe.train.eval_batch_size, pad_id)


@dataclass(frozen=True)
class Evaluator:
    """How training is evaluated, chosen by the objective's ``evaluation`` attribute.

    ``build(recipe, cls, data, tokenizer, pad_id, data_dir) -> evaluate(model) | None``;
    ``own_data``: it reads ``data.eval`` itself, so the objective's contract does not apply to it.
    """

    build: Callable[..., Optional[Callable[[Any], dict[str, float]]]]
    own_data: bool = False


EVALUATORS: dict[str, Evaluator] = {
    "classifier": Evaluator(_classifier_evaluator),
    "similarity": Evaluator(_similarity_evaluator, own_data=True),
}



def model_card_info(recipe: Recipe, cls, data: TaskData, state) -> dict[str, Any]:
    """What a saved folder's model card says about the run (``models/card.py`` renders it)."""
    params = {k: p.default for k, p in registry.hyperparameters(cls).items()}
    params.update(recipe.objective.params)
    doc = " ".join((cls.__doc__ or "").split("Paper:")[1].split("\n\n")[0].split()) if "Paper:" in (cls.__doc__ or "") else None
    return {"recipe": recipe.to_dict(), "objective": recipe.objective.name, "params": params,
            "summary": (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else "", "paper": doc,
            "train_examples": len(data.train) if data.train is not None else 0,
            "eval_examples": len(data.eval) if data.eval is not None else 0, "labels": data.label_names,
            "step": state.step if state is not None else 0,
            "eval": dict(state.last_eval) if state is not None else {},
            "metric": recipe.train.metric, "best_metric": getattr(state, "best_metric", None),
            "best_step": getattr(state, "best_step", None)}
