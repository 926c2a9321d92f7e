"""Recipes resolved once: a validated recipe becomes a :class:`Plan`, which every command takes.

``recipe.py`` checks the schema but sits below the objectives, so it cannot check an objective's
parameters or which metrics its evaluation computes. This module joins the two, once: it looks the
objective up by name, resolves ``model.problem_type: auto``, picks the label kind, the evaluation
kind and its metric names (from the one table in ``metrics/names.py``), the text columns and the
sampler. Below the pipelines nobody looks an objective up by name again (a test checks the source).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from finetune_cli.data.tasks import resolve_problem_type as resolve_data_problem
from finetune_cli.errors import RecipeError
from finetune_cli.metrics.names import REFIT_METRICS, metric_names
from finetune_cli.models.text_model import HeadSpec
from finetune_cli.objectives import registry
from finetune_cli.objectives.base import Objective
from finetune_cli.recipe import (
    ObjectiveConfig,
    Recipe,
    build_probe_recipe,
    build_recipe,
    closest,
    is_probe_tree,
    parse_probe_recipe,
    parse_recipe,
    read_recipe_source,
)


@dataclass(frozen=True)
class Plan:
    """Everything a command derives from a validated recipe, derived once: the recipe (objective
    parameters coerced, ``train.metric`` and ``model.problem_type`` resolved), the objective's class
    (its data contract) and parameters with defaults, the label kind (``class``, ``float``,
    ``multi`` or None), the evaluation kind (``classifier`` or ``similarity``), what training's
    evaluation computes (``metrics``: ``train.metric``, ``--expect`` and ``sweep --metric`` choose
    among them), the text columns in encoding order, whether a pair is one sequence (``joint``), and the batch sampler."""

    recipe: Recipe
    objective_cls: type[Objective]
    params: Mapping[str, Any]
    problem_type: Optional[str]
    label_type: Optional[str]
    evaluation: str
    metrics: tuple[str, ...]
    text_columns: tuple[str, ...]
    joint: bool
    sampler: str

    @property
    def objective_name(self) -> str:
        return self.recipe.objective.name

    @property
    def run_dir(self) -> Path:
        return self.recipe.run_dir

    def build_objective(self, labels: Any = None, num_labels: int = 0) -> Objective:
        """The objective; given the training labels, bound to them (``Objective.bind_labels``)."""
        obj = self.objective_cls(**dict(self.recipe.objective.params))
        if labels is not None:
            obj.bind_labels(labels, num_labels)
        return obj

    def head_spec(self, num_labels: int, encoder_dropout: float) -> HeadSpec:
        """The heads the objective needs on an encoder whose hidden dropout is ``encoder_dropout``."""
        cls, model = self.objective_cls, self.recipe.model
        problem = self.problem_type or "single_label_classification"
        return HeadSpec(
            pooling=model.pooling,
            num_labels=(1 if problem == "regression" else num_labels) if cls.needs_classifier else 0,
            classifier_dropout=encoder_dropout if model.classifier_dropout is None else model.classifier_dropout,
            spectral_norm=cls.spectral_norm_head,
            projection=cls.needs_projection if model.projection is None else model.projection,
            problem_type=problem, head=model.head, threshold=model.threshold, normalize=model.head_normalize,
            # a labels head's logits are cosines / the temperature the objective contrasted them at
            temperature=float(self.params.get("tau", 1.0)) if model.head == "labels" else 1.0,
        )

    def with_recipe(self, recipe: Recipe) -> Plan:
        """The plan of ``recipe`` (other output, other data): resolved again, never patched."""
        return plan_for(recipe)


# ---- resolving ---------------------------------------------------------------------------------

def resolve_problem_type(recipe: Recipe, cls: type[Objective]) -> Optional[str]:
    """``model.problem_type`` with ``auto`` resolved, checked against the objective."""
    requested = recipe.model.problem_type
    if requested is None:
        return None
    data = recipe.data_section
    problem = resolve_data_problem(data, requested) if data is not None else (
        "single_label_classification" if requested == "auto" else requested)
    if cls.needs_classifier and problem not in cls.problem_types:
        raise RecipeError(f"objective `{cls.name}` trains {' / '.join(cls.problem_types)} only, but the recipe "
                          f"{recipe.source} is {problem} (model.problem_type); use objective `ce` for it")
    return problem


def _metric_kind(cls: type[Objective], label_type: Optional[str]) -> Optional[str]:
    return "similarity" if cls.evaluation == "similarity" else label_type


def _training_metrics(cls: type[Objective], label_type: Optional[str], refit_head: bool) -> tuple[str, ...]:
    names = metric_names(_metric_kind(cls, label_type))
    return names + REFIT_METRICS if names and refit_head else names


def validate_objective(obj: ObjectiveConfig, where: str = "objective", src: str = "<recipe>") -> ObjectiveConfig:
    """The objective section with its parameters checked against the constructor and coerced."""
    return ObjectiveConfig(name=obj.name, params=registry.validate_params(obj.name, obj.params, where=where, src=src))


def validate_recipe(recipe: Recipe) -> Recipe:
    """A parsed recipe (training or probe) with its objective checked, ``model.problem_type``
    resolved and ``train.metric`` known to be computed by the objective's evaluation. Idempotent."""
    obj = validate_objective(recipe.objective, src=recipe.source)
    cls = registry.get(obj.name)
    problem = resolve_problem_type(recipe, cls)
    if problem is not None and problem != recipe.model.problem_type:
        recipe = dataclasses.replace(recipe, model=dataclasses.replace(recipe.model, problem_type=problem))
    registry.check_contract(recipe, cls)
    names = _training_metrics(cls, cls.label_type_for(problem), recipe.train.refit_head)
    train, metric = recipe.train, recipe.train.metric
    if metric is None:
        train = dataclasses.replace(train, metric=names[0] if names else "loss")
    elif names and metric not in names:
        raise RecipeError(f"`train.metric` in {recipe.source} is `{metric}`, which objective `{obj.name}` does "
                          f"not compute" + closest(metric, names, listing="it computes"))
    repo = recipe.output.push_to_hub
    if repo is not None:  # refused before any training, not after it
        from finetune_cli.pipelines.push import check_repo_id

        check_repo_id(repo, f"`output.push_to_hub` in {recipe.source}: ")
    return dataclasses.replace(recipe, objective=obj, train=train)


def comparable(recipe: Recipe) -> Recipe:
    """As two runs are compared: validated, every objective parameter given (its default if left out)."""
    p = plan_for(recipe)  # (a stored recipe keeps its parameters as written: ce.yaml's label_smoothing: 0.0)
    return dataclasses.replace(p.recipe, objective=ObjectiveConfig(p.objective_name, dict(p.params)))


def _text_columns(cls: type[Objective]) -> tuple[str, ...]:
    cols = [c for c in cls.required_columns if c != "label"]
    if cls.encoding == "joint" and "text_pair" not in cols:
        cols.append("text_pair")
    return tuple(cols)


def plan_for(recipe: Recipe) -> Plan:
    """Validate ``recipe`` (idempotent) and resolve it into a :class:`Plan`."""
    from finetune_cli.data.sampling import UNGROUPED

    recipe = validate_recipe(recipe)
    cls = registry.get(recipe.objective.name)
    problem = recipe.model.problem_type
    lt = cls.label_type_for(problem)
    return Plan(
        recipe=recipe, objective_cls=cls, params={**{k: p.default for k, p in registry.hyperparameters(cls).items()}, **recipe.objective.params},
        problem_type=problem, label_type=lt, evaluation=cls.evaluation,
        metrics=_training_metrics(cls, lt, recipe.train.refit_head),
        text_columns=_text_columns(cls), joint=cls.encoding == "joint",
        sampler=cls.sampler if recipe.data.group_by_length else UNGROUPED.get(cls.sampler, cls.sampler),
    )


# ---- loading -----------------------------------------------------------------------------------

def load_plan(path: str | Path | None, overrides: Sequence[str] = ()) -> Plan:
    """A training recipe (YAML file, packaged name, or defaults when ``path`` is None) with
    overrides, resolved into a plan."""
    return plan_for(parse_recipe(path, overrides))


def load_recipe(path: str | Path | None, overrides: Sequence[str] = ()) -> Recipe:
    return load_plan(path, overrides).recipe


def load_probe_recipe(path: str | Path, overrides: Sequence[str] = ()) -> Recipe:
    return validate_recipe(parse_probe_recipe(path, overrides))


def load_any(path: str | Path, overrides: Sequence[str] = ()) -> Recipe:
    """For ``finetune recipes list|validate``, which accept both kinds."""
    data, src = read_recipe_source(path, overrides)
    if is_probe_tree(data):
        return validate_recipe(build_probe_recipe(data, src))
    return validate_recipe(build_recipe(data, src))

