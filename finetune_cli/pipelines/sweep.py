"""``finetune sweep``: a seed-aware hyper-parameter search with optuna.

Each trial is the recipe plus sampled overrides, trained once per seed (``pipelines.multiseed``)
into ``<sweep>/trials/trial-<n>/seed-<k>/``; its value is the mean over seeds of the metric that
``finetune report`` reads for a run (``best/eval_metrics.json``: the best evaluation during
training). The sampler is TPE, seeded; the median pruner stops a trial whose evaluation metric,
reported during training by a trainer callback, is worse than the median of earlier trials at the
same point (step ``seed index × steps per seed + step``, so seeds line up across trials).

The study lives in ``<sweep>/study.db`` (SQLite): rerunning the same command resumes it. Finished
and pruned trials are kept; a trial cut short by Ctrl-C is tried again with the same parameters in
the same folder, so its finished seeds are skipped and an interrupted seed resumes from its
checkpoint. A trial whose training failed (e.g. a non-finite loss) counts as done and is not retried.

At the end: every trial's mean ± std over seeds; the recipe itself (its defaults for the swept
keys) trained over the same seeds into ``<sweep>/baseline/``, and the paired comparison of the
best trial against it (``finetune report``'s statistics); ``<sweep>/best.yaml``, the best
trial's resolved recipe, which ``finetune train -r`` runs as is.

Parameter specs (``--param KEY=SPEC``): ``uniform:a:b``, ``loguniform:a:b`` (a > 0), ``int:a:b``
(inclusive), ``choice:v1,v2,...`` (values parsed as YAML). Every spec is checked by validating the
recipe with its bounds (or each choice) before anything trains.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from finetune_cli.errors import FinetuneError, RunDirError, TrainingError
from finetune_cli.fsutil import atomic_write_json, atomic_write_text
from finetune_cli.pipelines.multiseed import run_seeds
from finetune_cli.recipe import Recipe, RecipeError, load_recipe

KINDS = ("uniform", "loguniform", "int", "choice")
STUDY_NAME = "finetune-sweep"
_NUM = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


@dataclass(frozen=True)
class ParamSpec:
    key: str
    kind: str
    low: Optional[float] = None
    high: Optional[float] = None
    choices: tuple[str, ...] = ()  # raw YAML text of each choice
    text: str = ""

    def values_to_check(self) -> list[Any]:
        if self.kind == "choice":
            return [yaml.safe_load(c) for c in self.choices]
        if self.kind == "int":
            return [int(self.low), int(self.high)]
        return [self.low, self.high]


def _bad(text: str, why: str) -> RecipeError:
    return RecipeError(f"--param {text}: {why}")


def parse_param(text: str) -> ParamSpec:
    """``train.lr=loguniform:1e-5:1e-4`` -> :class:`ParamSpec` (one-line errors)."""
    if "=" not in text:
        raise _bad(text, "write KEY=SPEC, e.g. train.lr=loguniform:1e-5:1e-4")
    key, spec = (s.strip() for s in text.split("=", 1))
    if not key or any(not k for k in key.split(".")):
        raise _bad(text, "empty key")
    if key in ("train.seed", "data.seed"):
        raise _bad(text, f"`{key}` is set by --seeds, not searched")
    if key.split(".")[0] == "output":
        raise _bad(text, "output.* is where runs go, not a hyper-parameter")
    kind, _, rest = spec.partition(":")
    if kind not in KINDS:
        raise _bad(text, f"unknown kind `{kind}`; use one of {', '.join(f'{k}:…' for k in KINDS)}")
    if kind == "choice":
        choices = tuple(c.strip() for c in rest.split(","))
        if len(choices) < 2 or not all(choices):
            raise _bad(text, "choice needs at least two comma-separated values, e.g. choice:0.1,0.3")
        if len(set(choices)) != len(choices):
            raise _bad(text, "choice lists a value twice")
        for c in choices:
            try:
                yaml.safe_load(c)
            except yaml.YAMLError:
                raise _bad(text, f"choice value {c!r} is not valid YAML") from None
        return ParamSpec(key, kind, choices=choices, text=text)
    parts = rest.split(":")
    if len(parts) != 2 or not all(_NUM.fullmatch(p.strip()) for p in parts):
        raise _bad(text, f"{kind} takes two numbers, {kind}:LOW:HIGH")
    low, high = (float(p) for p in parts)
    if kind == "int" and not all(re.fullmatch(r"[-+]?\d+", p.strip()) for p in parts):
        raise _bad(text, "int takes two integers, int:LOW:HIGH")
    if not low < high:
        raise _bad(text, f"LOW must be below HIGH, got {parts[0]} and {parts[1]}")
    if kind == "loguniform" and low <= 0:
        raise _bad(text, "loguniform needs LOW > 0")
    return ParamSpec(key, kind, low, high, text=text)


def override(key: str, value: Any) -> str:
    """``key=value`` that the recipe reads back as the same value (floats always with a dot or
    exponent that YAML reads as a float)."""
    if isinstance(value, float):
        s = repr(value)
        mant, e, exp = s.partition("e")
        if e and "." not in mant:
            s = f"{mant}.0e{exp}"
        return f"{key}={s}"
    return f"{key}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"


def check_specs(recipe_path: str, overrides: Sequence[str], specs: Sequence[ParamSpec]) -> Recipe:
    """Validate the recipe with every spec's bounds / choices; returns the base recipe."""
    keys = [s.key for s in specs]
    for k in keys:
        if keys.count(k) > 1:
            raise RecipeError(f"--param {k} is given twice")
    base = load_recipe(recipe_path, overrides)
    if not isinstance(base, Recipe):
        raise RecipeError(f"{recipe_path} is a probe recipe; `finetune sweep` searches training recipes")
    for s in specs:
        for v in s.values_to_check():
            try:
                load_recipe(recipe_path, [*overrides, override(s.key, v)])
            except RecipeError as e:
                raise _bad(s.text, str(e)) from None
    return base


# ---- the study ---------------------------------------------------------------------------------

@dataclass
class TrialRow:
    number: int
    state: str
    params: dict[str, Any]
    mean: Optional[float] = None
    std: Optional[float] = None
    values: dict[int, float] = field(default_factory=dict)
    run_dir: str = ""
    note: str = ""


@dataclass
class SweepResult:
    sweep_dir: str
    metric: str
    direction: str
    seeds: list[int]
    params: list[str]
    trials: list[TrialRow]
    best: Optional[TrialRow] = None
    baseline: Optional[TrialRow] = None
    comparison: Optional[dict[str, Any]] = None
    best_recipe: Optional[str] = None
    ran_now: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _import_optuna():
    try:
        import optuna
    except ImportError:
        raise FinetuneError("finetune sweep needs optuna: pip install 'finetune-cli[sweep]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


class PruneCallback:
    """Trainer callback: report each new evaluation of ``metric`` to the trial, prune if told."""

    def __init__(self, trial, metric: str, seed_index: int):
        self.trial, self.metric, self.seed_index = trial, metric, seed_index
        self._last = None

    def __call__(self, trainer, state) -> None:
        ev = state.last_eval
        if ev is self._last or self.metric not in ev:
            return
        self._last = ev
        step = self.seed_index * trainer.total_steps + state.step
        self.trial.report(float(ev[self.metric]), step)
        if self.trial.should_prune():
            import optuna

            raise optuna.TrialPruned(f"{self.metric} {ev[self.metric]:.4f} at step {state.step}")


def seed_values(run_dirs: Sequence[Path], seeds: Sequence[int], metric: str) -> dict[int, float]:
    """The per-seed value ``finetune report`` would use for each finished run."""
    from finetune_cli.pipelines.report import load_run

    out = {}
    for seed, d in zip(seeds, run_dirs, strict=True):
        rec = load_run(Path(d))
        if metric not in rec.metrics:
            raise FinetuneError(f"--metric {metric}: run {d} has no such metric (have: {', '.join(rec.metrics)})")
        out[seed] = rec.metrics[metric]
    return out


def _mean_std(values: dict[int, float]) -> tuple[Optional[float], Optional[float]]:
    from finetune_cli.pipelines.report import mean_std

    if not values:
        return None, None
    return mean_std(list(values.values()))


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
    overrides = [*overrides, f"train.metric={metric}"]
    base = check_specs(recipe_path, overrides, specs)
    from finetune_cli.pipelines.gate_metrics import train_metrics

    known = train_metrics(base)
    if known and metric not in known:
        raise RecipeError(f"--metric {metric}: training of objective `{base.objective.name}` evaluates "
                          f"{', '.join(known)}")
    direction = direction or ("minimize" if "loss" in metric else "maximize")
    optuna = _import_optuna()

    # named after output.name, else the recipe's name (`-r scl` and `-r recipes/scl.yaml` -> sweep-scl)
    name = base.output.name or Path(recipe_path).stem
    sweep_dir = Path(out) if out else Path(base.output.dir) / f"sweep-{name}"
    sweep_dir.mkdir(parents=True, exist_ok=True)
    cfg = _config(base, specs, seeds, metric, direction)
    cfg_file = sweep_dir / "sweep.json"
    if cfg_file.is_file():
        old = json.loads(cfg_file.read_text())
        if old != cfg:
            diff = next(k for k in cfg if old.get(k) != cfg[k])
            raise RunDirError(f"sweep directory {sweep_dir} holds a different sweep ({diff} differs); "
                              f"choose another --out or delete it")
    else:
        atomic_write_json(cfg_file, cfg)

    storage = f"sqlite:///{sweep_dir.resolve() / 'study.db'}"
    study = optuna.create_study(
        study_name=STUDY_NAME, storage=storage, load_if_exists=True, direction=direction,
        sampler=optuna.samplers.TPESampler(seed=sampler_seed),
        pruner=optuna.pruners.MedianPruner() if prune else optuna.pruners.NopPruner())
    TS = optuna.trial.TrialState

    # Trials cut short by an interruption (FAIL without a recorded training error) are tried again
    # with the same parameters in the same folder, unless a later trial already did.
    existing = study.get_trials(deepcopy=False)
    covered = {t.user_attrs.get("run_dir") for t in existing
               if t.state in (TS.COMPLETE, TS.PRUNED, TS.WAITING, TS.RUNNING) or "error" in t.user_attrs}
    for t in existing:
        rd = t.user_attrs.get("run_dir")
        if t.state == TS.FAIL and "error" not in t.user_attrs and rd not in covered:
            study.enqueue_trial(t.params, user_attrs={"run_dir": rd})
            covered.add(rd)
            ui.log(f"trial {t.number} was interrupted: trying its parameters again in {rd}")
    done = sum(1 for t in existing if t.state in (TS.COMPLETE, TS.PRUNED) or
               (t.state == TS.FAIL and "error" in t.user_attrs))
    todo = max(0, trials - done)
    if done:
        ui.log(f"resuming sweep {sweep_dir}: {done} trial(s) done, {todo} to run")

    def objective(trial) -> float:
        sampled = []
        for s in specs:
            if s.kind == "choice":
                idx = s.choices.index(trial.suggest_categorical(s.key, list(s.choices)))
                sampled.append(f"{s.key}={s.choices[idx]}")
            elif s.kind == "int":
                sampled.append(override(s.key, trial.suggest_int(s.key, int(s.low), int(s.high))))
            else:
                sampled.append(override(s.key, trial.suggest_float(s.key, s.low, s.high,
                                                                   log=s.kind == "loguniform")))
        rd = trial.user_attrs.get("run_dir") or str(sweep_dir / "trials" / f"trial-{trial.number:03d}")
        trial.set_user_attr("run_dir", rd)
        trial.set_user_attr("overrides", sampled)
        r = load_recipe(recipe_path, [*overrides, *sampled, f"output.dir={Path(rd).parent}",
                                      f"output.name={Path(rd).name}"])
        ui.rule(f"sweep trial {trial.number} · {' '.join(sampled)}")
        outs = []
        try:
            for i, seed in enumerate(seeds):
                cb = PruneCallback(trial, metric, i) if prune else None
                outs += run_seeds(r, [seed], ui, device=device, data_dir=data_dir,
                                  callbacks=[cb] if cb else [])
        except TrainingError as e:
            trial.set_user_attr("error", str(e))
            ui.warn(f"trial {trial.number} failed: {e}")
            raise
        vals = seed_values([o.run_dir for o in outs], seeds, metric)
        trial.set_user_attr("values", {str(k): v for k, v in vals.items()})
        mean, std = _mean_std(vals)
        ui.log(f"trial {trial.number}: {metric} {mean:.4f}" + (f" ± {std:.4f}" if std is not None else "")
               + f" over seeds {','.join(map(str, seeds))}")
        return float(mean)

    if todo:
        study.optimize(objective, n_trials=todo, catch=(TrainingError,))

    rows = [_row(t, TS) for t in study.get_trials(deepcopy=False)]
    res = SweepResult(sweep_dir=str(sweep_dir), metric=metric, direction=direction, seeds=list(seeds),
                      params=[s.key for s in specs], trials=rows, ran_now=todo)
    complete = [r for r in rows if r.state == "COMPLETE" and r.mean is not None]
    if not complete:
        return res
    best = (max if direction == "maximize" else min)(complete, key=lambda r: r.mean)
    res.best = best
    best_over = study.trials[best.number].user_attrs["overrides"]
    res.best_recipe = str(_write_best(recipe_path, overrides, best_over, base, sweep_dir))
    if baseline:
        b = dataclasses.replace(base, output=dataclasses.replace(base.output, dir=str(sweep_dir), name="baseline"))
        ui.rule("sweep baseline · the recipe's own values")
        outs = run_seeds(b, seeds, ui, device=device, data_dir=data_dir)
        vals = seed_values([o.run_dir for o in outs], seeds, metric)
        mean, std = _mean_std(vals)
        res.baseline = TrialRow(number=-1, state="COMPLETE", params={s.key: _get(base, s.key) for s in specs},
                                mean=mean, std=std, values=vals, run_dir=str(sweep_dir / "baseline"))
        from finetune_cli.pipelines.report import paired_stats

        shared = sorted(set(best.values) & set(vals))
        res.comparison = {"a": f"trial {best.number}", "b": "baseline", "metric": metric, "seeds": shared,
                          **paired_stats([best.values[s] for s in shared], [vals[s] for s in shared])}
    atomic_write_json(sweep_dir / "result.json", res.to_dict())
    return res


def _row(t, TS) -> TrialRow:
    vals = {int(k): float(v) for k, v in (t.user_attrs.get("values") or {}).items()}
    mean, std = _mean_std(vals)
    note = t.user_attrs.get("error", "")
    if t.state == TS.PRUNED:
        last = t.intermediate_values
        note = f"pruned at {max(last)} ({last[max(last)]:.4f})" if last else "pruned"
    elif t.state == TS.FAIL and not note:
        note = "interrupted"
    # choice values are stored as their YAML text: show them as the recipe reads them
    params = {k: yaml.safe_load(v) if isinstance(v, str) else v for k, v in t.params.items()}
    return TrialRow(number=t.number, state=t.state.name, params=params, mean=mean, std=std, values=vals,
                    run_dir=t.user_attrs.get("run_dir", ""), note=note)


def _get(recipe: Recipe, key: str) -> Any:
    node: Any = recipe.to_dict()
    for k in key.split("."):
        node = node.get(k) if isinstance(node, dict) else None
    return node


def _write_best(recipe_path: str, overrides: Sequence[str], best_over: Sequence[str], base: Recipe,
                sweep_dir: Path) -> Path:
    """``best.yaml``: the best trial's resolved recipe, output next to the base recipe's runs."""
    name = f"{base.output.name or Path(recipe_path).stem}-best"
    r = load_recipe(recipe_path, [*overrides, *best_over, f"output.dir={base.output.dir}", f"output.name={name}"])
    path = sweep_dir / "best.yaml"
    head = f"# best trial of the sweep in {sweep_dir}: {' '.join(best_over)}\n"
    atomic_write_text(path, head + r.to_yaml())
    return path


def fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if (v != 0 and (abs(v) < 1e-2 or abs(v) >= 1e4)) else f"{v:.4g}"
    return str(v)


def fmt_mean(row: TrialRow) -> str:
    if row.mean is None or (isinstance(row.mean, float) and math.isnan(row.mean)):
        return "–"
    return f"{row.mean:.4f}" + (f" ± {row.std:.4f}" if row.std is not None else "")
