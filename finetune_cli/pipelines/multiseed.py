"""``finetune train --seeds 1,2,3``: one run per seed into ``<output.dir>/<name>/seed-<k>/``.

Each seed is an ordinary ``run_train``: a finished seed (``summary.json`` present) is skipped, an
interrupted one resumes from its newest checkpoint, so rerunning the command finishes the set.
The seed sets ``train.seed``; ``data.seed`` defaults to it, so with ``data.few_shot=N`` every seed
also draws its own N examples per class, as few-shot studies do.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Optional

from finetune_cli.errors import RunDirError
from finetune_cli.pipelines.recipes import Plan
from finetune_cli.pipelines.train import TrainOutcome, run_train
from finetune_cli.recipe import RecipeError
from finetune_cli.rundir import RunDir


def parse_seeds(text: str) -> list[int]:
    """``"1,2,3"`` or ``"1-5"`` (or a mix, ``"1-3,7"``) -> distinct integers, in order."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(-?\d+)(?:-(-?\d+))?", part)
        if not m:
            raise RecipeError(f"--seeds must be comma-separated integers or ranges like 1-5, got {text!r}")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise RecipeError(f"--seeds range {part!r} is empty")
        for s in range(lo, hi + 1):
            if s in seeds:
                raise RecipeError(f"--seeds lists seed {s} twice")
            seeds.append(s)
    return seeds


def seed_plan(plan: Plan, seed: int) -> Plan:
    """The plan of one seed: ``train.seed=seed``, output ``<dir>/<name>/seed-<seed>``."""
    recipe = plan.recipe
    return plan.with_recipe(dataclasses.replace(
        recipe,
        train=dataclasses.replace(recipe.train, seed=seed),
        output=dataclasses.replace(recipe.output, dir=str(recipe.run_dir), name=f"seed-{seed}"),
    ))


def run_seeds(plan: Plan, seeds: Sequence[int], ui, *, device: str = "auto", data_dir: Optional[str] = None,
              overwrite: bool = False, callbacks: Sequence[Callable] = ()) -> list[TrainOutcome]:
    """Train ``plan`` once per seed; returns the outcomes in seed order."""
    if not seeds:
        raise RecipeError("--seeds is empty")
    recipe = plan.recipe
    if RunDir(recipe.run_dir).recipe_file.is_file():
        raise RunDirError(f"{recipe.run_dir} holds a single run; --seeds writes {recipe.run_dir}/seed-<k>/ runs, "
                          f"which would nest inside it: choose another output.name")
    if recipe.data.seed is not None:
        ui.warn(f"data.seed is fixed at {recipe.data.seed}: every seed trains on the same data sample")
    outcomes = []
    for k, seed in enumerate(seeds, 1):
        p = seed_plan(plan, seed)
        ui.log(f"seed {seed} ({k}/{len(seeds)}) -> {p.run_dir}")
        outcomes.append(run_train(p, ui, device=device, data_dir=data_dir, overwrite=overwrite, callbacks=callbacks))
    return outcomes

