"""Objectives by short name. Each module in this package registers its class with ``@register``;
modules are discovered, so adding an objective is adding one file."""

from __future__ import annotations

import difflib
import importlib
import inspect
import pkgutil
import typing
from collections.abc import Mapping
from typing import Any, Optional

from finetune_cli.errors import RecipeError, did_you_mean
from finetune_cli.objectives.base import Objective
from finetune_cli.recipe import coerce

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
        raise RecipeError(f"unknown objective `{name}`{did_you_mean(name, _REGISTRY)} "
                          f"(known: {', '.join(sorted(_REGISTRY))})")
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


def check_contract(recipe: Any, cls: type[Objective]) -> None:
    """Refuse, in one line, recipe keys the objective's data contract cannot serve: ``model.head:
    labels`` and ``data.label_descriptions`` need an objective that encodes the label texts
    (``label_texts``); ``data.eval_fraction`` needs one evaluated on labelled rows of its training data."""
    data = recipe.data_section  # None for a probe recipe: its data is named per task
    if recipe.train.refit_head:
        _check_refit(cls, recipe.model.problem_type, recipe.source)
    if data is not None and data.eval_fraction is not None and (cls.evaluation != "classifier" or
                                                                 "label" not in cls.required_columns):
        raise RecipeError(f"`data.eval_fraction` in {recipe.source}: objective `{cls.name}` is not evaluated on "
                          f"labelled rows of its training data; name the evaluation file with data.eval")
    if cls.label_texts:  # (single-label only: resolve_problem_type checks the objective's problem_types)
        return
    users = ", ".join(n for n in names() if get(n).label_texts)
    if recipe.model.head == "labels":
        raise RecipeError(f"`model.head: labels` in {recipe.source} predicts by similarity to the label texts, which "
                          f"objective `{cls.name}` never encodes; use an objective that trains on them ({users}) "
                          f"or model.head=pooled")
    if data is not None and data.label_descriptions:
        raise RecipeError(f"`data.label_descriptions` in {recipe.source} is read by objectives that encode the label "
                          f"texts ({users}); objective `{cls.name}` does not: drop it")


def _check_refit(cls: type[Objective], problem: Optional[str], src: str) -> None:
    """``train.refit_head`` refits a softmax head: what the objective's class says refuses it here,
    as ``recipes validate`` and before any model loads (``engine.head_refit`` keeps the checks
    only the loaded model can answer)."""
    why = ("it trains no classifier head" if not cls.needs_classifier
           else f"the problem is {problem}, and the refit is a softmax (logistic-regression) head"
           if problem not in (None, "single_label_classification")
           else "its head is spectrally normalised, and a refit would undo the 1-Lipschitz constraint"
           if cls.spectral_norm_head else None)
    if why is not None:
        raise RecipeError(f"`train.refit_head` in {src} does not apply to objective `{cls.name}`: {why}; drop "
                          f"train.refit_head")
