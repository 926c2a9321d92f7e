"""Recipes, fully validated: the schema (``recipe.py``) plus what only the objectives know (their
parameters, the metrics their evaluation computes). Every command reads recipes through here, so
a bad objective parameter or ``train.metric`` is refused before any data or model loads.

``recipe.py`` sits below the objectives and cannot check them itself; this module is the one
place that joins the two.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Union

from finetune_cli.objectives.registry import validate_recipe
from finetune_cli.recipe import (
    ProbeRecipe,
    Recipe,
    build_probe_recipe,
    build_recipe,
    is_probe_tree,
    parse_probe_recipe,
    parse_recipe,
    read_recipe_source,
)


def load_recipe(path: str | Path | None, overrides: Sequence[str] = ()) -> Recipe:
    """A training recipe (YAML file, packaged name, or defaults when ``path`` is None) with
    overrides, validated in full."""
    return validate_recipe(parse_recipe(path, overrides))


def load_probe_recipe(path: str | Path, overrides: Sequence[str] = ()) -> ProbeRecipe:
    return validate_recipe(parse_probe_recipe(path, overrides))


def load_any(path: str | Path, overrides: Sequence[str] = ()) -> Union[Recipe, ProbeRecipe]:
    """For ``finetune recipes list|validate``, which accept both kinds."""
    data, src = read_recipe_source(path, overrides)
    if is_probe_tree(data):
        return validate_recipe(build_probe_recipe(data, src))
    return validate_recipe(build_recipe(data, src))
