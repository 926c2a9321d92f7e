"""``finetune sweep``: a seed-aware hyper-parameter search with optuna.

Each trial is the recipe plus sampled overrides, trained once per seed into
``<sweep>/trials/trial-<n>/seed-<k>/``; its value is the mean over seeds of the metric ``finetune
report`` reads for a run. TPE, seeded; the median pruner stops a trial whose evaluation metric (a
trainer callback reports it) is worse than the median of earlier trials at the same point (step
``seed index × steps per seed + step``, so seeds line up across trials).

The study lives in ``<sweep>/study.db`` (SQLite): rerunning the same command resumes it. Finished
and pruned trials are kept; a trial cut short by Ctrl-C is tried again with the same parameters in
the same folder, so its finished seeds are skipped and an interrupted seed resumes from its
checkpoint. A trial whose training failed (e.g. a non-finite loss) counts as done and is not retried.

At the end: every trial's mean ± std over seeds; the recipe itself (its defaults for the swept
keys) trained over the same seeds into ``<sweep>/baseline/``, and the paired comparison of the
best trial against it (``finetune report``'s statistics); ``<sweep>/best.yaml``, the best
trial's resolved recipe, which ``finetune train -r`` runs as is.

Parameter specs (``--param KEY=SPEC``): ``uniform:a:b``, ``loguniform:a:b`` (a > 0), ``int:a:b``
(inclusive), ``choice:v1,v2,...`` (YAML values), each checked on the recipe before anything trains.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from finetune_cli.engine.search import (
    ParamSpec,
    PruneCallback,
    SweepResult,
    TrialRow,
    bad_param,
    dotted_value,
    import_optuna,
    mean_std_of,
    override,
    parse_param,
    requeue_interrupted,
    sample_overrides,
    trial_row,
)
from finetune_cli.errors import TrainingError
from finetune_cli.fsutil import atomic_write_json, atomic_write_text
from finetune_cli.inputs import check_output_apart
from finetune_cli.pipelines.multiseed import run_seeds
from finetune_cli.pipelines.recipes import Plan, load_plan, load_recipe
from finetune_cli.pipelines.runs import seed_values
from finetune_cli.recipe import Recipe, RecipeError, closest
from finetune_cli.rundir import same_job


def check_specs(recipe_path: str, overrides: Sequence[str], specs: Sequence[ParamSpec], metric: str) -> Plan:
    """Validate the recipe with every spec's bounds / choices and ``--metric`` against what its
    training evaluates; returns the base plan (with ``train.metric`` set to ``metric``)."""
    keys = [s.key for s in specs]
    for k in keys:
        if keys.count(k) > 1:
            raise RecipeError(f"--param {k} is given twice")
    known = load_plan(recipe_path, [*overrides, "~train.metric"]).metrics
    if known and metric not in known:
        raise RecipeError(f"--metric {metric}: training of this recipe evaluates {', '.join(known)}"
                          + closest(metric, known, listing=None))
    overrides = [*overrides, f"train.metric={metric}"]
    base = load_plan(recipe_path, overrides)
    for s in specs:
        for v in s.values_to_check():
            try:
                load_plan(recipe_path, [*overrides, override(s.key, v)])
            except RecipeError as e:
                raise bad_param(s.text, str(e)) from None
    return base


STUDY_NAME = "finetune-sweep"  # the optuna study inside <sweep>/study.db

def _config(base: Recipe, specs: Sequence[ParamSpec], seeds: Sequence[int], metric: str, direction: str):
    d = base.to_dict()
    d.pop("output", None)
    return {"recipe": d, "params": [s.text for s in specs], "seeds": list(seeds), "metric": metric,
            "direction": direction}


def run_sweep(recipe_path: str, overrides: Sequence[str], params: Sequence[str], ui, *, trials: int,
              seeds: Sequence[int], metric: str, direction: Optional[str] = None, out: Optional[str] = None,
              sampler_seed: int = 0, prune: bool = True, baseline: bool = True, device: str = "auto",
              data_dir: Optional[str] = None) -> SweepResult:
    if not params:
        raise RecipeError("finetune sweep needs at least one --param KEY=SPEC")
    if trials < 1:
        raise RecipeError("--trials must be at least 1")
    specs = [parse_param(p) for p in params]
    base = check_specs(recipe_path, overrides, specs, metric)
    overrides = [*overrides, f"train.metric={metric}"]
    direction = direction or ("minimize" if "loss" in metric else "maximize")
    optuna = import_optuna()
    # named after output.name, else the recipe's name (`-r scl` and `-r recipes/scl.yaml` -> sweep-scl)
    name = base.recipe.output.name or Path(recipe_path).stem
    sweep_dir = Path(out) if out else Path(base.recipe.output.dir) / f"sweep-{name}"
    check_output_apart(sweep_dir, base.recipe, "sweep folder")
    _claim_sweep_dir(sweep_dir, _config(base.recipe, specs, seeds, metric, direction))
    study = optuna.create_study(
        study_name=STUDY_NAME, storage=f"sqlite:///{sweep_dir.resolve() / 'study.db'}", load_if_exists=True,
        direction=direction, sampler=optuna.samplers.TPESampler(seed=sampler_seed),
        pruner=optuna.pruners.MedianPruner() if prune else optuna.pruners.NopPruner())
    todo = requeue_interrupted(study, optuna.trial.TrialState, trials, sweep_dir, ui)
    if todo:
        trial_fn = _trial_objective(recipe_path, overrides, specs, seeds, metric, sweep_dir, ui,
                                    prune=prune, device=device, data_dir=data_dir)
        study.optimize(trial_fn, n_trials=todo, catch=(TrainingError,))
    rows = [trial_row(t, optuna.trial.TrialState) for t in study.get_trials(deepcopy=False)]
    res = SweepResult(sweep_dir=str(sweep_dir), metric=metric, direction=direction, seeds=list(seeds),
                      params=[s.key for s in specs], trials=rows, ran_now=todo)
    complete = [r for r in rows if r.state == "COMPLETE" and r.mean is not None]
    if not complete:
        return res
    res.best = (max if direction == "maximize" else min)(complete, key=lambda r: r.mean)
    best_over = study.trials[res.best.number].user_attrs["overrides"]
    res.best_recipe = str(_write_best(recipe_path, overrides, best_over, base.recipe, sweep_dir))
    if baseline:
        _compare_with_baseline(res, base, specs, sweep_dir, ui, device=device, data_dir=data_dir)
    atomic_write_json(sweep_dir / "result.json", res.to_dict())
    return res


def _claim_sweep_dir(sweep_dir: Path, cfg: dict[str, Any]) -> None:
    """``sweep.json`` records what the folder's study searches; another search there is refused."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    cfg_file = sweep_dir / "sweep.json"
    stored = json.loads(cfg_file.read_text()) if cfg_file.is_file() else None
    if not same_job(Path(f"sweep directory {sweep_dir}"), stored, cfg, kind="sweep", overwrite=False,
                    remedy="choose another --out or delete it"):
        atomic_write_json(cfg_file, cfg)


def _trial_objective(recipe_path: str, overrides: Sequence[str], specs: Sequence[ParamSpec], seeds: Sequence[int],
                     metric: str, sweep_dir: Path, ui, *, prune: bool, device: str, data_dir: Optional[str]):
    """optuna's objective: train the sampled recipe on every seed, return the mean of ``metric``."""

    def objective(trial) -> float:
        sampled = sample_overrides(trial, specs)
        rd = trial.user_attrs.get("run_dir") or str(sweep_dir / "trials" / f"trial-{trial.number:03d}")
        trial.set_user_attr("run_dir", rd)
        trial.set_user_attr("overrides", sampled)
        plan = load_plan(recipe_path, [*overrides, *sampled, f"output.dir={Path(rd).parent}",
                                       f"output.name={Path(rd).name}"])
        ui.rule(f"sweep trial {trial.number} · {' '.join(sampled)}")
        outs = []
        try:
            for i, seed in enumerate(seeds):
                cb = PruneCallback(trial, metric, i) if prune else None
                outs += run_seeds(plan, [seed], ui, device=device, data_dir=data_dir, callbacks=[cb] if cb else [])
        except TrainingError as e:
            trial.set_user_attr("error", str(e))
            ui.warn(f"trial {trial.number} failed: {e}")
            raise
        vals = seed_values([o.run_dir for o in outs], seeds, metric)
        trial.set_user_attr("values", {str(k): v for k, v in vals.items()})
        mean, std = mean_std_of(vals)
        ui.log(f"trial {trial.number}: {metric} {mean:.4f}" + (f" ± {std:.4f}" if std is not None else "")
               + f" over seeds {','.join(map(str, seeds))}")
        return float(mean)

    return objective


def _compare_with_baseline(res: SweepResult, base: Plan, specs: Sequence[ParamSpec], sweep_dir: Path, ui, *,
                           device: str, data_dir: Optional[str]) -> None:
    """The recipe's own values trained over the same seeds, and the best trial paired against it."""
    from finetune_cli.metrics.stats import paired_stats

    r, best, seeds = base.recipe, res.best, res.seeds
    assert best is not None
    b = base.with_recipe(dataclasses.replace(r, output=dataclasses.replace(r.output, dir=str(sweep_dir),
                                                                           name="baseline")))
    ui.rule("sweep baseline · the recipe's own values")
    outs = run_seeds(b, seeds, ui, device=device, data_dir=data_dir)
    vals = seed_values([o.run_dir for o in outs], seeds, res.metric)
    mean, std = mean_std_of(vals)
    res.baseline = TrialRow(number=-1, state="COMPLETE", params={s.key: dotted_value(r, s.key) for s in specs},
                            mean=mean, std=std, values=vals, run_dir=str(sweep_dir / "baseline"))
    shared = sorted(set(best.values) & set(vals))
    res.comparison = {"a": f"trial {best.number}", "b": "baseline", "metric": res.metric, "seeds": shared,
                      **paired_stats([best.values[s] for s in shared], [vals[s] for s in shared])}


def _write_best(recipe_path: str, overrides: Sequence[str], best_over: Sequence[str], base: Recipe,
                sweep_dir: Path) -> Path:
    """``best.yaml``: the best trial's resolved recipe, output next to the base recipe's runs."""
    name = f"{base.output.name or Path(recipe_path).stem}-best"
    r = load_recipe(recipe_path, [*overrides, *best_over, f"output.dir={base.output.dir}", f"output.name={name}"])
    path = sweep_dir / "best.yaml"
    head = f"# best trial of the sweep in {sweep_dir}: {' '.join(best_over)}\n"
    atomic_write_text(path, head + r.to_yaml())
    return path


