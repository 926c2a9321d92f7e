"""Recipes: a YAML file plus command-line overrides, validated into frozen dataclasses.

Every other module receives these typed objects, never raw dicts. Every error names the key,
the file it came from and, for a misspelt key, the closest valid one.

Overrides are dotted ``key=value`` pairs (the value is parsed as YAML, so ``train.lr=3e-5`` is a
float and ``data.columns.text_pair=null`` is ``None``) and ``~key`` removes a key so that its
default applies again.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import yaml

PACKAGED_RECIPES = Path(__file__).resolve().parent / "recipes"


class RecipeError(ValueError):
    """A recipe could not be read or validated. The message is one line, ready for the user."""


def _f(default: Any = dataclasses.MISSING, *, choices: Sequence[Any] | None = None, gt: float | None = None,
       ge: float | None = None, le: float | None = None, lt: float | None = None, help: str = "",
       default_factory: Any = dataclasses.MISSING) -> Any:
    meta = {"choices": choices, "gt": gt, "ge": ge, "le": le, "lt": lt, "help": help}
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class ModelConfig:
    """Which encoder to fine-tune and how sentences become vectors."""

    name: str = _f("embedded", help="`embedded` (packaged all-MiniLM-L6-v2), a local folder, a run directory or a hub id")
    pooling: str = _f("mean", choices=("cls", "mean", "pooler"))
    max_length: int = _f(128, gt=0, le=8192)
    classifier_dropout: Optional[float] = _f(None, ge=0.0, lt=1.0, help="dropout before the head; None = the encoder's hidden dropout")
    revision: Optional[str] = _f(None, help="hub revision (branch, tag or commit)")
    dropout: Optional[float] = _f(None, ge=0.0, lt=1.0, help="encoder dropout (hidden and attention); None = the encoder's own config")
    projection: Optional[bool] = _f(None, help="add the projection MLP (SimCSE's cls+MLP, used for the loss only); default: the objective's needs_projection")


@dataclass(frozen=True)
class ColumnMap:
    """Names (or 0-based indices, for header-less files) of the columns the task reads."""

    text: Union[str, int] = "text"
    text_pair: Optional[Union[str, int]] = None
    label: Optional[Union[str, int]] = "label"
    hard_neg: Optional[Union[str, int]] = None


@dataclass(frozen=True)
class DataConfig:
    """Where the data comes from and how much of it to use."""

    dataset: Optional[str] = _f(None, help="hub dataset `name` or `name/config` (e.g. glue/sst2); a GLUE task is read from --data-dir when given")
    train: Optional[str] = _f(None, help="local training file (csv, tsv, jsonl, parquet, txt)")
    eval: Optional[str] = _f(None, help="local evaluation file")
    train_split: str = "train"
    eval_split: str = "validation"
    format: str = _f("auto", choices=("auto", "csv", "tsv", "jsonl", "json", "parquet", "txt"))
    header: str = _f("auto", choices=("auto", "yes", "no"))
    columns: ColumnMap = _f(default_factory=ColumnMap)
    label_names: Optional[list[str]] = _f(None, help="fix the label order (id i = label_names[i]); default: sorted labels of the training set")
    few_shot: Optional[int] = _f(None, gt=0, help="keep N training examples per class (seeded)")
    max_train_samples: Optional[int] = _f(None, gt=0)
    max_eval_samples: Optional[int] = _f(None, gt=0)
    seed: Optional[int] = _f(None, help="seed for sampling the data; default: train.seed")
    group_by_length: bool = True
    eval_columns: Optional[ColumnMap] = _f(None, help="column map of the evaluation file when it differs from `columns` (e.g. STS pairs for SimCSE)")
    nli_triplets: bool = _f(False, help="build (anchor, positive, hard_neg) triplets from NLI rows (text=premise, text_pair=hypothesis, label)")


@dataclass(frozen=True)
class ObjectiveConfig:
    """The objective's short name and its hyper-parameters (checked against its constructor)."""

    name: str = "ce"
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TrainConfig:
    """The optimisation schedule, evaluation cadence and checkpointing."""

    epochs: float = _f(3.0, gt=0)
    max_steps: Optional[int] = _f(None, gt=0, help="stop after this many optimizer steps (overrides epochs)")
    batch_size: int = _f(32, gt=0)
    eval_batch_size: int = _f(128, gt=0)
    lr: float = _f(2e-5, gt=0)
    head_lr: Optional[float] = _f(None, gt=0, help="learning rate of the new head; default: lr")
    weight_decay: float = _f(0.01, ge=0)
    warmup_ratio: float = _f(0.06, ge=0, le=1)
    grad_accum: int = _f(1, gt=0)
    max_grad_norm: Optional[float] = _f(1.0, gt=0)
    eval_every: Optional[int] = _f(None, gt=0, help="evaluate every N optimizer steps; default: once per epoch")
    save_every: Optional[int] = _f(None, gt=0, help="checkpoint every N steps; default: at each evaluation")
    keep_checkpoints: int = _f(2, ge=1)
    early_stopping_patience: Optional[int] = _f(None, gt=0, help="stop after N evaluations without improvement")
    metric: str = _f("accuracy", help="evaluation metric that picks the best checkpoint")
    greater_is_better: Optional[bool] = _f(None, help="default: True unless the metric is a loss")
    seed: int = 42
    precision: str = _f("auto", choices=("auto", "fp32", "bf16", "fp16"))
    log_every: int = _f(10, gt=0)
    compile: bool = _f(False, help="torch.compile the encoder; batch widths are rounded up to multiples of 16")


@dataclass(frozen=True)
class OutputConfig:
    dir: str = "runs"
    name: Optional[str] = _f(None, help="run name; default: the recipe file's stem")


@dataclass(frozen=True)
class Recipe:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    source: str = field(default="<defaults>", compare=False, metadata={"internal": True})

    # ---- derived -------------------------------------------------------------------------
    @property
    def run_dir(self) -> Path:
        name = self.output.name or (Path(self.source).stem if self.source.endswith((".yaml", ".yml")) else "run")
        return Path(self.output.dir) / name

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=False)

    def fingerprint(self) -> str:
        """Hash of everything that changes what a run computes (output location excluded)."""
        d = self.to_dict()
        d.pop("output", None)
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ---- plain <-> dataclass ---------------------------------------------------------------------

def _to_plain(obj: Any) -> Any:
    if isinstance(obj, ObjectiveConfig):
        return {"name": obj.name, **{k: _to_plain(v) for k, v in obj.params.items()}}
    if dataclasses.is_dataclass(obj):
        return {f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if not f.metadata.get("internal")}
    if isinstance(obj, Mapping):
        return {k: _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_plain(v) for v in obj]
    return obj


def _closest(key: str, options: Sequence[str]) -> str:
    m = difflib.get_close_matches(key, list(options), n=1, cutoff=0.5)
    return f"; did you mean `{m[0]}`?" if m else f"; valid keys: {', '.join(options)}"


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp)).replace("typing.", "")


def _coerce(value: Any, tp: Any, where: str, src: str) -> Any:
    """Check ``value`` against the annotation ``tp``; ints are accepted where floats are expected."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, where, src)
            except RecipeError as e:
                errors.append(e)
        names = " or ".join(_type_name(a) for a in args if a is not type(None))
        raise RecipeError(f"`{where}` in {src} must be {names}, got {value!r}")
    if origin in (list, Sequence):
        (inner,) = typing.get_args(tp) or (Any,)
        if not isinstance(value, (list, tuple)):
            raise RecipeError(f"`{where}` in {src} must be a list, got {value!r}")
        return [_coerce(v, inner, f"{where}[{i}]", src) for i, v in enumerate(value)]
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise RecipeError(f"`{where}` in {src} must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise RecipeError(f"`{where}` in {src} must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):
            # YAML 1.1 reads `1e-3` (no dot) as a string; accept any float literal.
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RecipeError(f"`{where}` in {src} must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise RecipeError(f"`{where}` in {src} must be a string, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, where, src)
    return value


def _check_range(value: Any, meta: Mapping[str, Any], where: str, src: str) -> None:
    if value is None:
        return
    choices = meta.get("choices")
    if choices and value not in choices:
        raise RecipeError(f"`{where}` in {src} must be one of {', '.join(map(str, choices))}; got {value!r}")
    for op, test, word in (("gt", lambda v, b: v > b, ">"), ("ge", lambda v, b: v >= b, ">="),
                           ("lt", lambda v, b: v < b, "<"), ("le", lambda v, b: v <= b, "<=")):
        bound = meta.get(op)
        if bound is not None and not test(value, bound):
            raise RecipeError(f"`{where}` in {src} must be {word} {bound}; got {value!r}")


def _build(cls: type, data: Any, prefix: str, src: str) -> Any:
    if cls is ObjectiveConfig:
        return _build_objective(data, prefix, src)
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise RecipeError(f"`{prefix or 'recipe'}` in {src} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    kwargs = {}
    for key, value in data.items():
        where = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields:
            raise RecipeError(f"unknown key `{where}` in {src}" + _closest(
                f"{prefix}.{key}" if prefix else str(key), [f"{prefix}.{k}" if prefix else k for k in fields]))
        value = _coerce(value, hints[key], where, src)
        _check_range(value, fields[key].metadata, where, src)
        kwargs[key] = value
    return cls(**kwargs)


def _build_objective(data: Any, prefix: str, src: str) -> ObjectiveConfig:
    from finetune_cli.objectives import registry  # late: objectives import torch

    if data is None:
        data = {}
    if isinstance(data, str):
        data = {"name": data}
    if not isinstance(data, Mapping):
        raise RecipeError(f"`{prefix}` in {src} must be a mapping with a `name`, got {data!r}")
    data = dict(data)
    name = data.pop("name", "ce")
    params = registry.validate_params(name, data, where=prefix, src=src)
    return ObjectiveConfig(name=name, params=params)


# ---- overrides --------------------------------------------------------------------------------

def apply_overrides(tree: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``a.b=value`` (value parsed as YAML) and ``~a.b`` (remove) to a nested dict."""
    tree = json.loads(json.dumps(tree, default=str)) if tree else {}
    for ov in overrides:
        if ov.startswith("~"):
            keys = ov[1:].split(".")
            node = tree
            for k in keys[:-1]:
                node = node.get(k) if isinstance(node, dict) else None
                if node is None:
                    break
            if isinstance(node, dict):
                node.pop(keys[-1], None)
            continue
        if "=" not in ov:
            raise RecipeError(f"override `{ov}` must look like key=value or ~key")
        key, raw = ov.split("=", 1)
        if not key or any(not k for k in key.split(".")):
            raise RecipeError(f"override `{ov}` has an empty key")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError as e:
            raise RecipeError(f"override `{ov}`: value is not valid YAML ({_one_line(e)})") from None
        node = tree
        keys = key.split(".")
        for k in keys[:-1]:
            nxt = node.get(k)
            if not isinstance(nxt, dict):
                nxt = {} if nxt is None else nxt
                if not isinstance(nxt, dict):
                    raise RecipeError(f"override `{ov}`: `{k}` is not a mapping")
                node[k] = nxt
            node = nxt
        node[keys[-1]] = value
    return tree


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())


# ---- loading ----------------------------------------------------------------------------------

def resolve_recipe_path(recipe: str | Path) -> Path:
    """A path, or the name of a packaged recipe (``scl`` or ``scl.yaml``)."""
    p = Path(recipe)
    if p.exists():
        if p.is_dir():
            raise RecipeError(f"recipe {p} is a directory, not a YAML file")
        return p
    for cand in (PACKAGED_RECIPES / f"{recipe}.yaml", PACKAGED_RECIPES / str(recipe)):
        if cand.is_file():
            return cand
    known = sorted(q.stem for q in PACKAGED_RECIPES.rglob("*.yaml"))
    raise RecipeError(f"recipe file not found: {recipe}" + _closest(str(p.stem), known).replace("valid keys", "packaged recipes"))


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise RecipeError(f"cannot read recipe {path}: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(e, "problem", None) or _one_line(e)
        raise RecipeError(f"malformed YAML in {where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RecipeError(f"recipe {path} must be a YAML mapping at top level, got {type(data).__name__}")
    return data


def build_recipe(data: Mapping[str, Any], source: str = "<recipe>") -> Recipe:
    """Validate a plain nested dict into a :class:`Recipe`."""
    recipe = _build(Recipe, data, "", source)
    recipe = dataclasses.replace(recipe, source=source)
    _cross_checks(recipe)
    return recipe


def load_recipe(path: str | Path | None, overrides: Sequence[str] = ()) -> Recipe:
    """Read a YAML recipe (or start from defaults when ``path`` is None) and apply overrides."""
    if path is None:
        data, src = {}, "<command line>"
    else:
        p = resolve_recipe_path(path)
        data, src = read_yaml(p), str(path)
    data = apply_overrides(data, overrides)
    if "probe" in data:  # a `finetune probe` recipe: validated by its own schema (same machinery)
        from finetune_cli.pipelines.probe import build_probe_recipe

        return build_probe_recipe(data, src)  # type: ignore[return-value]
    return build_recipe(data, src)


def _cross_checks(r: Recipe) -> None:
    d, src = r.data, r.source
    if d.dataset and (d.train or d.eval):
        raise RecipeError(f"`data.dataset` and `data.train`/`data.eval` in {src} are exclusive; use one")
    if d.few_shot and d.max_train_samples:
        raise RecipeError(f"`data.few_shot` and `data.max_train_samples` in {src} are exclusive; use one")
