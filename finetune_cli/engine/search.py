"""Hyper-parameter search plumbing for ``finetune sweep``: the ``--param`` search space, the
trainer callback that reports evaluations to optuna (median pruning), and trial records.
The study itself (one trial = the recipe over several seeds) is composed in ``pipelines/sweep.py``."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from finetune_cli.errors import FinetuneError, RecipeError

KINDS = ("uniform", "loguniform", "int", "choice")
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


def bad_param(text: str, why: str) -> RecipeError:
    return RecipeError(f"--param {text}: {why}")


def parse_param(text: str) -> ParamSpec:
    """``train.lr=loguniform:1e-5:1e-4`` -> :class:`ParamSpec` (one-line errors)."""
    if "=" not in text:
        raise bad_param(text, "write KEY=SPEC, e.g. train.lr=loguniform:1e-5:1e-4")
    key, spec = (s.strip() for s in text.split("=", 1))
    if not key or any(not k for k in key.split(".")):
        raise bad_param(text, "empty key")
    if key in ("train.seed", "data.seed"):
        raise bad_param(text, f"`{key}` is set by --seeds, not searched")
    if key.split(".")[0] == "output":
        raise bad_param(text, "output.* is where runs go, not a hyper-parameter")
    kind, _, rest = spec.partition(":")
    if kind not in KINDS:
        raise bad_param(text, f"unknown kind `{kind}`; use one of {', '.join(f'{k}:…' for k in KINDS)}")
    if kind == "choice":
        choices = tuple(c.strip() for c in rest.split(","))
        if len(choices) < 2 or not all(choices):
            raise bad_param(text, "choice needs at least two comma-separated values, e.g. choice:0.1,0.3")
        if len(set(choices)) != len(choices):
            raise bad_param(text, "choice lists a value twice")
        for c in choices:
            try:
                yaml.safe_load(c)
            except yaml.YAMLError:
                raise bad_param(text, f"choice value {c!r} is not valid YAML") from None
        return ParamSpec(key, kind, choices=choices, text=text)
    parts = rest.split(":")
    if len(parts) != 2 or not all(_NUM.fullmatch(p.strip()) for p in parts):
        raise bad_param(text, f"{kind} takes two numbers, {kind}:LOW:HIGH")
    low, high = (float(p) for p in parts)
    if kind == "int" and not all(re.fullmatch(r"[-+]?\d+", p.strip()) for p in parts):
        raise bad_param(text, "int takes two integers, int:LOW:HIGH")
    if not low < high:
        raise bad_param(text, f"LOW must be below HIGH, got {parts[0]} and {parts[1]}")
    if kind == "loguniform" and low <= 0:
        raise bad_param(text, "loguniform needs LOW > 0")
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


def import_optuna():
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


def mean_std_of(values: dict[int, float]) -> tuple[Optional[float], Optional[float]]:
    from finetune_cli.metrics.stats import mean_std

    if not values:
        return None, None
    return mean_std(list(values.values()))


def trial_row(t, TS) -> TrialRow:
    vals = {int(k): float(v) for k, v in (t.user_attrs.get("values") or {}).items()}
    mean, std = mean_std_of(vals)
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


def dotted_value(recipe, key: str) -> Any:
    """``recipe``'s value at a dotted key such as ``objective.tau`` (None when absent)."""
    node: Any = recipe.to_dict()
    for k in key.split("."):
        node = node.get(k) if isinstance(node, dict) else None
    return node


def requeue_interrupted(study, TS, trials: int, sweep_dir: Path, ui) -> int:
    """Trials cut short by an interruption (FAIL without a recorded training error) are tried again
    with the same parameters in the same folder, unless a later trial already did. Returns how
    many trials are left to run."""
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
    return todo


def sample_overrides(trial, specs: Sequence[ParamSpec]) -> list[str]:
    """The trial's overrides, one per swept key."""
    sampled = []
    for s in specs:
        if s.kind == "choice":
            idx = s.choices.index(trial.suggest_categorical(s.key, list(s.choices)))
            sampled.append(f"{s.key}={s.choices[idx]}")
        elif s.kind == "int":
            sampled.append(override(s.key, trial.suggest_int(s.key, int(s.low), int(s.high))))
        else:
            sampled.append(override(s.key, trial.suggest_float(s.key, s.low, s.high, log=s.kind == "loguniform")))
    return sampled


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
