"""Objectives by short name. Each module in this package registers its class with ``@register``;
modules are discovered, so adding an objective is adding one file."""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import pkgutil
import typing
from collections.abc import Mapping
from typing import Any, Optional, TypeVar

from finetune_cli.data.tasks import resolve_problem_type as resolve_data_problem
from finetune_cli.errors import RecipeError
from finetune_cli.metrics.names import metric_names
from finetune_cli.objectives.base import Objective
from finetune_cli.recipe import ObjectiveConfig, closest, coerce

R = TypeVar("R")

_REGISTRY: dict[str, type[Objective]] = {}
_LOADED = False


def register(name: str):
    def deco(cls: type[Objective]) -> type[Objective]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise RuntimeError(f"objective name `{name}` registered twice")
        cls.name = name
        _REGISTRY[name] = cls
        return cls
    return deco


def _load_all() -> None:
    global _LOADED
    if _LOADED:
        return
    import finetune_cli.objectives as pkg

    for mod in pkgutil.iter_modules(pkg.__path__):
        if mod.name not in ("base", "registry") and not mod.name.startswith("_"):
            importlib.import_module(f"finetune_cli.objectives.{mod.name}")
    _LOADED = True


def names() -> list[str]:
    _load_all()
    return sorted(_REGISTRY)


def get(name: str) -> type[Objective]:
    _load_all()
    if name not in _REGISTRY:
        m = difflib.get_close_matches(name, list(_REGISTRY), n=1)
        hint = f"; did you mean `{m[0]}`?" if m else ""
        raise RecipeError(f"unknown objective `{name}`{hint} (known: {', '.join(sorted(_REGISTRY))})")
    return _REGISTRY[name]


def hyperparameters(cls: type[Objective]) -> dict[str, inspect.Parameter]:
    sig = inspect.signature(cls.__init__)
    return {k: p for k, p in sig.parameters.items()
            if k != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def validate_params(name: str, params: Mapping[str, Any], where: str = "objective", src: str = "<recipe>",
                    ) -> dict[str, Any]:
    """Check ``params`` against the objective's constructor and its own range checks."""
    cls = get(name)
    hp = hyperparameters(cls)
    hints = typing.get_type_hints(cls.__init__)
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key not in hp:
            m = difflib.get_close_matches(key, list(hp), n=1, cutoff=0.5)
            hint = f"; did you mean `{where}.{m[0]}`?" if m else (
                f"; `{name}` takes {', '.join(hp) or 'no parameters'}")
            raise RecipeError(f"unknown key `{where}.{key}` in {src} for objective `{name}`{hint}")
        ann = hints.get(key)
        out[key] = coerce(value, ann, f"{where}.{key}", src) if ann is not None else value
    try:
        cls(**out)
    except (ValueError, TypeError) as e:
        raise RecipeError(f"invalid `{where}` in {src} for objective `{name}`: {e}") from None
    return out


def build(name: str, params: Mapping[str, Any]) -> Objective:
    return get(name)(**dict(params))


PROBLEM_LABEL_TYPES = {"regression": "float", "multi_label_classification": "multi"}


def label_type(cls: type[Objective], problem_type: Optional[str] = None) -> Optional[str]:
    """The label type the data is mapped to: the objective's own, or the problem type's
    (``float`` for regression, ``multi`` for multi-label) for an objective with a classifier."""
    if cls.needs_classifier and problem_type in PROBLEM_LABEL_TYPES:
        return PROBLEM_LABEL_TYPES[problem_type]
    return cls.label_type


def evaluation_metrics(cls: type[Objective], problem_type: Optional[str] = None) -> tuple[str, ...]:
    """The metrics that evaluating during training with this objective computes."""
    kind = "similarity" if cls.evaluation == "similarity" else label_type(cls, problem_type)
    return metric_names(kind)


def resolve_problem_type(recipe: Any, cls: type[Objective]) -> Optional[str]:
    """``model.problem_type`` with ``auto`` resolved, checked against the objective."""
    model = getattr(recipe, "model", None)
    requested = getattr(model, "problem_type", None)
    if requested is None:
        return None
    data = getattr(recipe, "data", None)
    problem = resolve_data_problem(data, requested) if data is not None else (
        "single_label_classification" if requested == "auto" else requested)
    if cls.needs_classifier and problem not in cls.problem_types:
        raise RecipeError(f"objective `{cls.name}` trains {' / '.join(cls.problem_types)} only, but the recipe "
                          f"{recipe.source} is {problem} (model.problem_type); use objective `ce` for it")
    return problem


def validate_objective(obj: ObjectiveConfig, where: str = "objective", src: str = "<recipe>") -> ObjectiveConfig:
    """The objective section with its parameters checked and coerced (the schema check that
    ``recipe.py`` cannot do, since the objectives live above it)."""
    return ObjectiveConfig(name=obj.name, params=validate_params(obj.name, obj.params, where=where, src=src))


def validate_recipe(recipe: R) -> R:
    """A parsed recipe (training or probe) with its objective checked and ``train.metric`` known
    to be computed by the objective's evaluation. Idempotent."""
    obj = validate_objective(recipe.objective, src=recipe.source)  # type: ignore[attr-defined]
    cls = get(obj.name)
    problem = resolve_problem_type(recipe, cls)
    if problem is not None and problem != recipe.model.problem_type:  # type: ignore[attr-defined]
        recipe = dataclasses.replace(recipe, model=dataclasses.replace(recipe.model, problem_type=problem))  # type: ignore[type-var,attr-defined]
    names = evaluation_metrics(cls, problem)
    train = recipe.train  # type: ignore[attr-defined]
    metric = train.metric
    if metric is None:
        train = dataclasses.replace(train, metric=names[0] if names else "loss")
    elif names and metric not in names:
        raise RecipeError(f"`train.metric` in {recipe.source} is `{metric}`, which objective `{obj.name}` does "  # type: ignore[attr-defined]
                          f"not compute" + closest(metric, names).replace("valid keys", "it computes"))
    return dataclasses.replace(recipe, objective=obj, train=train)  # type: ignore[type-var]
