"""Recipes: a YAML file plus command-line overrides, validated into frozen dataclasses.

Every other module receives these typed objects, never raw dicts. Every error names the key,
the file it came from and, for a misspelt key, the closest valid one.

Overrides are dotted ``key=value`` pairs (the value is parsed as YAML, so ``train.lr=3e-5`` is a
float and ``data.columns.text_pair=null`` is ``None``) and ``~key`` removes a key so that its
default applies again.
"""

from __future__ import annotations

import codecs
import dataclasses
import hashlib
import json
import math
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import yaml

from finetune_cli.errors import RecipeError, did_you_mean, error_text

PACKAGED_RECIPES = Path(__file__).resolve().parent / "recipes"
# Seeds go to torch.manual_seed / numpy, which take at most 64-bit values; numpy's Generator
# refuses negative ones.
SEED_MAX = 2**63 - 1

__all__ = ["RecipeError", "Recipe", "parse_recipe", "parse_probe_recipe", "build_recipe",
           "build_probe_recipe", "apply_overrides", "resolve_recipe_path", "read_yaml"]


def field_spec(default: Any = dataclasses.MISSING, *, choices: Sequence[Any] | None = None, gt: float | None = None,
       ge: float | None = None, le: float | None = None, lt: float | None = None, help: str = "",
       default_factory: Any = dataclasses.MISSING) -> Any:
    meta = {"choices": choices, "gt": gt, "ge": ge, "le": le, "lt": lt, "help": help}
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class LoraConfig:
    """Low-rank adapters (LoRA, via `peft`) instead of full fine-tuning: the encoder's weights stay
    frozen, rank-`r` updates are trained beside the `target_modules`, and the head is always trained."""

    r: int = field_spec(8, gt=0, help="rank of each low-rank update")
    alpha: float = field_spec(16.0, gt=0, help="scale of the update (alpha / r multiplies it)")
    dropout: float = field_spec(0.1, ge=0.0, lt=1.0, help="dropout on the adapters' input")
    target_modules: Optional[list[str]] = field_spec(None, help="names of the linear layers that get an adapter "
                                                     "(e.g. [query, key, value, dense]); null = peft's default "
                                                     "for the architecture (query and value for BERT/RoBERTa)")


# ``model.truncation``: which tokens of a too-long row are kept (``data/encode.py`` cuts them).
TRUNCATION_RULES = ("head", "tail", "head_tail")


@dataclass(frozen=True)
class ModelConfig:
    """Which encoder to fine-tune and how sentences become vectors."""

    name: str = field_spec("embedded", help="`embedded` (packaged all-MiniLM-L6-v2), a local folder, a run directory or a hub id")
    pooling: str = field_spec("mean", choices=("cls", "mean", "pooler"), help="how token states become one sentence "
                              "embedding: mean of the non-padding tokens, the first token, or the encoder's pooler")
    max_length: int = field_spec(128, gt=0, help="tokens kept per encoded sequence (a jointly encoded "
                                 "pair counts both texts); longer inputs are truncated")
    classifier_dropout: Optional[float] = field_spec(None, ge=0.0, lt=1.0, help="dropout before the head; None = the encoder's hidden dropout")
    revision: Optional[str] = field_spec(None, help="hub revision (branch, tag or commit)")
    dropout: Optional[float] = field_spec(None, ge=0.0, lt=1.0, help="encoder dropout (hidden and attention); None = the encoder's own config")
    projection: Optional[bool] = field_spec(None, help="add the projection MLP (SimCSE's cls+MLP, used for the loss only); default: the objective's needs_projection")
    head: str = field_spec("native", choices=("native", "pooled", "labels"), help="classifier head: `native` = the architecture's own *ForSequenceClassification head (loads in transformers as is); `pooled` = model.pooling + linear (finetune-only folder); `labels` = cosine similarity of the normalised pooled embedding to each label's text / the objective's tau, saved as a pooled head (objectives that train on the label texts, e.g. fastfit)")
    reinit_layers: int = field_spec(0, ge=0, help="re-initialise the encoder's top k layers (and its pooler) before training, as Zhang et al. 2021 for few-sample BERT; 0 = keep every pre-trained layer")
    head_normalize: bool = field_spec(False, help="pooled head only: L2-normalise the pooled embedding before dropout -> linear (the unit-sphere features a contrastive term shapes and SetFit's head reads)")
    problem_type: str = field_spec("auto", choices=("auto", "single_label_classification", "regression", "multi_label_classification"), help="as transformers' config.problem_type; auto: multi-label when data.label_separator is set, regression for a regression GLUE task (glue:stsb), else single-label")
    threshold: float = field_spec(0.5, gt=0.0, lt=1.0, help="multi-label: a label is predicted when its sigmoid probability >= threshold, in training's evaluations; eval and predict use the per-label thresholds tuned on the evaluation data instead (--threshold to choose)")
    truncation: str = field_spec("head", choices=TRUNCATION_RULES, help="which tokens a row longer than max_length "
                                 "keeps: head (the first), tail (the last), head_tail (the first quarter of the budget "
                                 "and the last three quarters, Sun et al. 2019); saved with the model for predict/eval")
    lora: Optional[LoraConfig] = field_spec(None, help="train low-rank adapters instead of every weight; the "
                                            "saved folders are peft adapter folders (pip install 'finetune-cli[lora]')")


@dataclass(frozen=True)
class ColumnMap:
    """Names (or 0-based indices, for header-less files) of the columns the task reads."""

    text: Union[str, int] = field_spec("text", help="the text column (the first sentence of a pair)")
    text_pair: Optional[Union[str, int]] = field_spec(None, help="the second text of a sentence pair; null = single texts")
    label: Optional[Union[str, int]] = field_spec("label", help="the label column; null for unlabelled data (simcse_unsup)")
    hard_neg: Optional[Union[str, int]] = field_spec(None, help="the hard-negative text of a triplet (simcse_sup's "
                                                       "contradiction sentence)")


@dataclass(frozen=True)
class DataConfig:
    """Where the data comes from and how much of it to use."""

    dataset: Optional[str] = field_spec(None, help="hub dataset `name` or `name/config` (e.g. glue/sst2); a GLUE task is read from --data-dir when given")
    train: Optional[str] = field_spec(None, help="local training file (csv, tsv, jsonl, parquet, txt)")
    eval: Optional[str] = field_spec(None, help="local evaluation file")
    train_split: str = field_spec("train", help="split of `dataset` to train on")
    eval_split: str = field_spec("validation", help="split of `dataset` to evaluate on")
    eval_fraction: Optional[float] = field_spec(None, gt=0.0, lt=1.0, help="carve an evaluation split from the "
                                                "training data: this share of its rows, stratified by label, seeded "
                                                "(data.seed, else train.seed); recorded in the run's split.json; "
                                                "exclusive with data.eval (with data.dataset it replaces eval_split)")
    format: str = field_spec("auto", choices=("auto", "csv", "tsv", "jsonl", "json", "parquet", "txt"),
                             help="format of the local files; auto = from the file extension")
    header: str = field_spec("auto", choices=("auto", "yes", "no"), help="csv/tsv: is the first row a header; auto = "
                             "yes when it holds every column name the task reads")
    columns: ColumnMap = field_spec(default_factory=ColumnMap, help="which columns hold the texts and the label")
    label_names: Optional[list[str]] = field_spec(None, help="fix the label order (id i = label_names[i]); default: sorted labels of the training set")
    few_shot: Optional[int] = field_spec(None, gt=0, help="keep N training examples per class (seeded)")
    max_train_samples: Optional[int] = field_spec(None, gt=0, help="train on a seeded random subset of N examples; "
                                                  "exclusive with few_shot")
    max_eval_samples: Optional[int] = field_spec(None, gt=0, help="evaluate on a seeded random subset of N examples")
    seed: Optional[int] = field_spec(None, ge=0, le=SEED_MAX, help="seed for sampling the data; default: train.seed")
    group_by_length: bool = field_spec(True, help="batch examples of similar length together (less padding); false = "
                                       "batches in random or stratified order")
    eval_columns: Optional[ColumnMap] = field_spec(None, help="column map of the evaluation file when it differs from `columns` (e.g. STS pairs for SimCSE)")
    nli_triplets: bool = field_spec(False, help="build (anchor, positive, hard_neg) triplets from NLI rows (text=premise, text_pair=hypothesis, label)")
    encoding: str = field_spec("utf-8", help="text encoding of local data files (utf-8, latin-1, cp1252 …); a UTF-8 BOM is dropped")
    drop_invalid: bool = field_spec(False, help="drop rows with a missing label or an empty text (with a count) instead of refusing the data")
    label_separator: Optional[str] = field_spec(None, help="multi-label: labels of a row given as one string joined by this separator (e.g. `,`); a list column (JSONL) needs none")
    label_descriptions: Optional[dict[str, str]] = field_spec(None, help="label name -> the text an objective that "
                                                             "trains on the label texts (fastfit) encodes for it; "
                                                             "labels left out are encoded by their name")


@dataclass(frozen=True)
class ObjectiveConfig:
    """The objective's short name and its hyper-parameters (checked against its constructor)."""

    name: str = field_spec("ce", help="the objective's short name (one of the objectives below)")
    params: Mapping[str, Any] = field_spec(default_factory=dict, help="the objective's hyper-parameters, written as "
                                           "keys beside `name`")


LR_SCHEDULERS = ("linear", "cosine", "constant", "constant_with_warmup", "polynomial")
OPTIMIZERS = ("adamw_fused", "adamw", "sgd", "adafactor")
CUDA_GRAPHS = ("off", "auto", "on")


@dataclass(frozen=True)
class TrainConfig:
    """The optimisation schedule, evaluation cadence and checkpointing."""

    epochs: float = field_spec(3.0, gt=0, help="passes over the training set; a fraction stops part-way")
    max_steps: Optional[int] = field_spec(None, gt=0, help="stop after this many optimizer steps (overrides epochs)")
    min_steps: Optional[int] = field_spec(None, gt=0, help="train at least this many optimizer steps, repeating epochs "
                                                          "(few-shot runs: a budget in steps, not epochs); "
                                                          "max_steps, when set, decides alone")
    batch_size: int = field_spec(32, gt=0, help="examples per batch on each process (one step takes grad_accum batches)")
    eval_batch_size: int = field_spec(128, gt=0, help="examples per batch when evaluating")
    lr: float = field_spec(2e-5, gt=0, help="peak learning rate, reached after the warm-up (train.lr_scheduler shapes the rest)")
    head_lr: Optional[float] = field_spec(None, gt=0, help="learning rate of the new head; default: lr")
    weight_decay: float = field_spec(0.01, ge=0, help="AdamW weight decay (biases and norm weights get none)")
    warmup_ratio: float = field_spec(0.06, ge=0, le=1, help="fraction of the steps spent warming the learning rate up from 0")
    warmup_steps: Optional[int] = field_spec(None, ge=0, help="steps spent warming the learning rate up from 0; "
                                             "when set, replaces warmup_ratio")
    lr_scheduler: str = field_spec("linear", choices=LR_SCHEDULERS, help="how the learning rate moves after the "
                                   "warm-up (transformers' get_scheduler): linear or cosine decay to 0, constant, "
                                   "constant_with_warmup, polynomial (power 1, to 1e-7)")
    optimizer: str = field_spec("adamw_fused", choices=OPTIMIZERS, help="adamw_fused: torch AdamW with its fused "
                                "kernel on CPU and CUDA (one kernel per step); adamw: torch AdamW's per-tensor "
                                "implementation; sgd: torch SGD (no momentum); adafactor: transformers' Adafactor "
                                "at train.lr (no relative step), the smallest optimizer state")
    gradient_checkpointing: bool = field_spec(False, help="recompute the encoder's activations in the backward pass "
                                              "instead of keeping them: less memory, about a third more time")
    grad_accum: int = field_spec(1, gt=0, help="batches whose gradients are accumulated into one optimizer step")
    max_grad_norm: Optional[float] = field_spec(1.0, gt=0, help="clip the gradient norm to this value; null = no clipping")
    eval_every: Optional[int] = field_spec(None, gt=0, help="evaluate every N optimizer steps; default: once per epoch")
    min_evals: Optional[int] = field_spec(None, gt=0, help="evaluate about N times, evenly spaced over the run, "
                                                          "instead of once per epoch (shortens a longer eval_every)")
    save_every: Optional[int] = field_spec(None, gt=0, help="checkpoint every N steps; default: at each evaluation")
    keep_checkpoints: int = field_spec(2, ge=1, help="checkpoints kept for resuming (the newest checkpoint-<step>/ folders)")
    early_stopping_patience: Optional[int] = field_spec(None, gt=0, help="stop after N evaluations without improvement")
    metric: Optional[str] = field_spec(None, help="evaluation metric that picks the best checkpoint; default: the "
                                                  "objective's first (accuracy, pearson or spearman)")
    greater_is_better: Optional[bool] = field_spec(None, help="default: True unless the metric is a loss")
    seed: int = field_spec(42, ge=0, le=SEED_MAX, help="seed of the new heads' initialisation, the batch order, "
                                   "dropout and noise (and of data sampling unless data.seed is set)")
    precision: str = field_spec("auto", choices=("auto", "fp32", "bf16", "fp16"), help="mixed precision; auto = bf16 "
                                "on a GPU that has it, else fp32; fp16 needs a GPU")
    log_every: int = field_spec(10, gt=0, help="log the training loss every N optimizer steps")
    freeze_encoder: bool = field_spec(False, help="train only the heads on frozen encoder features (a linear probe "
                                                  "trained by the objective; the encoder also runs without dropout)")
    refit_head: bool = field_spec(False, help="before every evaluation, refit the head's last linear layer to "
                                  "convergence on the training set's current features (L2 logistic regression, "
                                  "scikit-learn's C=1), as SetFit and a linear probe fit theirs; training goes on "
                                  "from it and best/ is chosen with it; single-label classification; costs one "
                                  "forward pass over the training set per evaluation")
    compile: bool = field_spec(False, help="torch.compile the encoder; batch widths are rounded up to multiples of 16")
    cuda_graphs: str = field_spec("off", choices=CUDA_GRAPHS, help="capture the training step as a CUDA graph per "
                                  "batch width (batches padded up to multiples of 32, at most model.max_length) and "
                                  "replay it: one process on a GPU, an objective that can be captured; auto: where it "
                                  "can (one line says why not elsewhere); on: refuse where it cannot; off: eager steps")
    report_to: list[str] = field_spec(default_factory=list, help="experiment trackers fed through accelerate: "
                              "tensorboard, mlflow, trackio, wandb (default: none; metrics.jsonl always)")


# Tracker name -> the module it needs; the pip extra has the tracker's name.
TRACKERS: dict[str, str] = {"tensorboard": "tensorboard", "mlflow": "mlflow", "trackio": "trackio", "wandb": "wandb"}


@dataclass(frozen=True)
class OutputConfig:
    """Where the run directory goes."""

    dir: str = field_spec("runs", help="parent folder of run directories")
    name: Optional[str] = field_spec(None, help="run name; default: the recipe file's stem")
    push_to_hub: Optional[str] = field_spec(None, help="repo id (`user/name`): push the run's best/ (else final/) "
                                            "to the Hugging Face Hub when training succeeds")
    hub_private: bool = field_spec(False, help="create that Hub repository private (`finetune train --private`)")


# The sections of a probe recipe's ``probe:`` (see :class:`Recipe` and ``build_probe_recipe``).

@dataclass(frozen=True)
class SplitConfig:
    """Make a train/eval pair from one split (e.g. QNLI has only dev, QQP only a train slice)."""

    source: Optional[str] = field_spec(None, choices=("train", "eval"), help="which split to cut in two; None = no cut")
    eval_fraction: float = field_spec(0.2, gt=0.0, lt=1.0, help="share of the split's rows that become the eval part")
    seed: Optional[int] = field_spec(None, ge=0, le=SEED_MAX, help="default: the task's data.seed, then train.seed")


@dataclass(frozen=True)
class ProbeTask:
    """One named task: where its data is, and how much of it the stages and probes use."""

    data: DataConfig = field_spec(default_factory=DataConfig, help="the task's data, with the keys of a training "
                                  "recipe's `data` section")
    split: SplitConfig = field_spec(default_factory=SplitConfig, help="cut one split into train/eval (seeded)")
    probe_train_samples: Optional[int] = field_spec(None, gt=0, help="fit the probe on at most N train examples")


@dataclass(frozen=True)
class ClassifierConfig:
    """The linear probe: L2 logistic regression on standardised pooled features."""

    C: float = field_spec(1.0, gt=0, help="inverse L2 regularisation strength (scikit-learn's C)")
    max_iter: int = field_spec(200, gt=0, help="fixed L-BFGS budget")
    batch_size: int = field_spec(128, gt=0, help="feature-extraction batch size")


@dataclass(frozen=True)
class ProbeSection:
    """The tasks a probe run trains on and probes, and the linear probe."""

    tasks: dict = field_spec(default_factory=dict, help="name -> task")
    sequence: list[str] = field_spec(default_factory=list, help="sequential: the task order (default: all tasks)")
    source: Optional[str] = field_spec(None, help="generalization: the task to fine-tune on")
    targets: list[str] = field_spec(default_factory=list, help="generalization: tasks probed (default: the others)")
    cycles: int = field_spec(2, gt=0, help="retention: passes over the sequence")
    keep_checkpoints: bool = field_spec(False, help="keep a finished stage's checkpoint-*/ folders (only needed to resume a stage)")
    classifier: ClassifierConfig = field_spec(default_factory=ClassifierConfig, help=ClassifierConfig.__doc__)


@dataclass(frozen=True)
class Recipe:
    """A recipe: what ``finetune train`` trains (``data`` names the data), or, with a ``probe``
    section, what ``finetune probe`` trains stage by stage (its data named per task there)."""

    model: ModelConfig = field_spec(default_factory=ModelConfig, help=ModelConfig.__doc__)
    data: DataConfig = field_spec(default_factory=DataConfig, help=DataConfig.__doc__)
    objective: ObjectiveConfig = field_spec(default_factory=ObjectiveConfig, help=ObjectiveConfig.__doc__)
    train: TrainConfig = field_spec(default_factory=TrainConfig, help=TrainConfig.__doc__)
    output: OutputConfig = field_spec(default_factory=OutputConfig, help=OutputConfig.__doc__)
    # A probe recipe (``finetune probe``) names its data per task here, and has no ``data``.
    probe: Optional[ProbeSection] = field_spec(None, help=ProbeSection.__doc__)
    source: str = field(default="<defaults>", compare=False, metadata={"internal": True})

    def to_dict(self) -> dict[str, Any]:
        d = to_plain(self)
        if self.probe is None:  # a training recipe's tree (and fingerprint) as before probes were recipes
            d.pop("probe")
        else:
            d.pop("data")
        return d

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=False)

    @property
    def data_section(self) -> Optional[DataConfig]:
        """The ``data`` section; None for a probe recipe, whose data is named per task."""
        return self.data if self.probe is None else None

    # ---- derived -------------------------------------------------------------------------
    @property
    def run_dir(self) -> Path:
        """Where the run (or the probe's stages and results) goes."""
        return Path(self.output.dir) / (self.output.name or _stem(self.source, "run" if self.probe is None else "probe"))

    def fingerprinted(self, ignore_seeds: bool = False) -> dict[str, Any]:
        """Everything that changes what a run computes (output location excluded), as a tree.
        ``ignore_seeds``: the same for every seed of one recipe (``finetune report`` groups by it)."""
        d = self.to_dict()
        d.pop("output", None)
        if ignore_seeds:
            d["train"].pop("seed", None)
            d["data"].pop("seed", None)
        d["train"].pop("report_to", None)  # where metrics are also sent does not change the run
        # Keys added after runs were made, at their default, change no run: those runs (and the study's
        # ledger cells keyed by this) keep their fingerprint.
        for section, key, default in ADDED_KEYS:
            if key in d.get(section, {}) and d[section][key] == default:
                d[section].pop(key)
        return d

    def fingerprint(self, ignore_seeds: bool = False) -> str:
        """Hash of :meth:`fingerprinted`."""
        d = self.fingerprinted(ignore_seeds)
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


# (section, key, default) of the keys added since the first runs and ledger cells were made
ADDED_KEYS = (("data", "label_descriptions", None), ("data", "eval_fraction", None), ("model", "truncation", "head"),
              ("train", "cuda_graphs", "off"))


def _stem(source: str, default: str) -> str:
    """The run name a recipe gives by default: its file's stem (``recipes/scl.yaml`` and the packaged
    name ``scl`` both give ``scl``); ``default`` for a recipe built from the command line alone."""
    if not source or source.startswith("<"):
        return default
    return Path(source).stem if source.endswith((".yaml", ".yml")) else (Path(source).name or default)


# ---- plain <-> dataclass ---------------------------------------------------------------------

def to_plain(obj: Any) -> Any:
    if isinstance(obj, ObjectiveConfig):
        return {"name": obj.name, **{k: to_plain(v) for k, v in obj.params.items()}}
    if dataclasses.is_dataclass(obj):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if not f.metadata.get("internal")}
    if isinstance(obj, Mapping):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    return obj


# transformers' ``TrainingArguments`` names (and a few from its neighbours) -> our key: a recipe
# written with Trainer vocabulary gets pointed at ours, wherever in the tree the name was put.
TRAINER_NAMES: dict[str, str] = {
    "learning_rate": "train.lr", "num_train_epochs": "train.epochs", "max_steps": "train.max_steps",
    "per_device_train_batch_size": "train.batch_size", "per_device_eval_batch_size": "train.eval_batch_size",
    "gradient_accumulation_steps": "train.grad_accum", "weight_decay": "train.weight_decay",
    "warmup_ratio": "train.warmup_ratio", "warmup_steps": "train.warmup_steps", "max_grad_norm": "train.max_grad_norm",
    "lr_scheduler_type": "train.lr_scheduler", "optim": "train.optimizer",
    "gradient_checkpointing": "train.gradient_checkpointing", "eval_steps": "train.eval_every",
    "save_steps": "train.save_every", "logging_steps": "train.log_every", "save_total_limit": "train.keep_checkpoints",
    "seed": "train.seed", "fp16": "train.precision=fp16", "bf16": "train.precision=bf16",
    "metric_for_best_model": "train.metric", "greater_is_better": "train.greater_is_better",
    "report_to": "train.report_to", "torch_compile": "train.compile", "early_stopping_patience":
    "train.early_stopping_patience", "output_dir": "output.dir", "run_name": "output.name",
    "label_smoothing_factor": "objective.label_smoothing", "model_name_or_path": "model.name",
    "max_seq_length": "model.max_length", "eval_strategy": "train.eval_every", "save_strategy": "train.save_every",
    "evaluation_strategy": "train.eval_every", "push_to_hub": "output.push_to_hub", "hub_model_id": "output.push_to_hub",
    "hub_private_repo": "output.hub_private",
}
# Trainer names with no key of ours: what finetune does instead.
TRAINER_NOTES: dict[str, str] = {
    "load_best_model_at_end": "every run keeps its best evaluation in best/ (by `train.metric`); no key needed",
    "adam_beta1": "finetune's AdamW uses torch's betas (0.9, 0.999); no key changes them",
    "adam_beta2": "finetune's AdamW uses torch's betas (0.9, 0.999); no key changes them",
    "adam_epsilon": "finetune's AdamW uses torch's eps (1e-8); no key changes it",
    "resume_from_checkpoint": "pass `--resume CHECKPOINT_DIR` to finetune train (a rerun into the same run folder "
                              "resumes by itself)",
    "overwrite_output_dir": "pass `--overwrite` to finetune train",
}
# Trainer values of a key we have, as ours (`optim=adamw_torch` is our `train.optimizer=adamw`).
TRAINER_VALUES: dict[str, str] = {
    "adamw_torch": "adamw", "adamw_torch_fused": "adamw_fused", "adamw_hf": "adamw",
    "cosine_with_restarts": "cosine (no restarts: one cosine decay over the run)",
    "cosine_with_min_lr": "cosine (it decays to 0)", "inverse_sqrt": "polynomial",
}


# Names from other libraries' vocabularies (Keras, scikit-learn) -> our key and what it means.
OTHER_NAMES: dict[str, tuple[str, str]] = {
    "validation_split": ("data.eval_fraction", "a share of the training rows held out, not a split name"),
    "validation_fraction": ("data.eval_fraction", "a share of the training rows held out"),
    "test_size": ("data.eval_fraction", "a share of the training rows held out"),
    "val_split": ("data.eval_fraction", "a share of the training rows held out"),
}


def closest(key: str, options: Sequence[str], listing: Optional[str] = "valid keys") -> str:
    """The hint for an unknown ``key``: its name in our vocabulary when it is a transformers Trainer
    name, else the one option it begins, else the closest spelling, else ``; <listing>: <options>``
    (nothing when ``listing`` is None)."""
    last = key.rsplit(".", 1)[-1]
    ours = TRAINER_NAMES.get(last)
    if ours and ours.split("=")[0] != key:  # (`train.seed` is our own key)
        return f"; did you mean `{ours}`? (`{last}` is a transformers Trainer name)"
    if last in TRAINER_NOTES:
        return f"; `{last}` is a transformers Trainer name: {TRAINER_NOTES[last]}"
    if (other := OTHER_NAMES.get(last)) and other[0] != key:
        return f"; did you mean `{other[0]}`? ({other[1]})"

    prefixed = [o for o in options if key and str(o).startswith(key)]
    if len(prefixed) == 1:
        return f"; did you mean `{prefixed[0]}`?"
    return did_you_mean(key, options, cutoff=0.5) or (f"; {listing}: {', '.join(options)}" if listing else "")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp)).replace("typing.", "")


def _coerce_union(value: Any, args: tuple[Any, ...], where: str, src: str) -> Any:
    if value is None and type(None) in args:
        return None
    errors = []
    for a in args:
        if a is type(None):
            continue
        try:
            return coerce(value, a, where, src)
        except RecipeError as e:
            errors.append(e)
    if len(errors) == 1:  # Optional[X]: X's own error names the sub-key and its rule
        raise errors[0]
    names = " or ".join(_type_name(a) for a in args if a is not type(None))
    raise RecipeError(f"`{where}` in {src} must be {names}, got {value!r}")


def coerce(value: Any, tp: Any, where: str, src: str) -> Any:
    """Check ``value`` against the annotation ``tp``; ints are accepted where floats are expected."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return _coerce_union(value, typing.get_args(tp), where, src)
    if origin in (dict, Mapping):
        key_t, val_t = typing.get_args(tp) or (Any, Any)
        if not isinstance(value, Mapping):
            raise RecipeError(f"`{where}` in {src} must be a mapping, got {value!r}")
        return {coerce(k, key_t, f"{where}", src): coerce(v, val_t, f"{where}.{k}", src) for k, v in value.items()}
    if origin in (list, Sequence):
        (inner,) = typing.get_args(tp) or (Any,)
        if not isinstance(value, (list, tuple)):
            raise RecipeError(f"`{where}` in {src} must be a list, got {value!r}")
        return [coerce(v, inner, f"{where}[{i}]", src) for i, v in enumerate(value)]
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
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RecipeError(f"`{where}` in {src} must be a number, got {value!r}")
        try:
            value = float(value)
        except OverflowError:
            value = math.inf
        if not math.isfinite(value):
            raise RecipeError(f"`{where}` in {src} must be a finite number, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise RecipeError(f"`{where}` in {src} must be a string, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        return build_section(tp, value, where, src)
    return value


_YAML_WORDS = (("on", "off"), ("yes", "no"))


def _yaml_word(value: Any, meta: Mapping[str, Any]) -> Any:
    """``on``/``off`` and ``yes``/``no`` as written: YAML 1.1 reads them as booleans, and a key whose
    choices are those words (``train.cuda_graphs``, ``data.header``) means the word."""
    choices = meta.get("choices") or ()
    if isinstance(value, bool):
        for yes, no in _YAML_WORDS:
            if yes in choices and no in choices:
                return yes if value else no
    return value


def _check_range(value: Any, meta: Mapping[str, Any], where: str, src: str) -> None:
    if value is None:
        return
    choices = meta.get("choices")
    if choices and value not in choices:
        ours = TRAINER_VALUES.get(value) if isinstance(value, str) else None
        hint = f"; did you mean `{ours}`? (`{value}` is a transformers Trainer value)" if ours else ""
        raise RecipeError(f"`{where}` in {src} must be one of {', '.join(map(str, choices))}; got {value!r}{hint}")
    for op, test, word in (("gt", lambda v, b: v > b, ">"), ("ge", lambda v, b: v >= b, ">="),
                           ("lt", lambda v, b: v < b, "<"), ("le", lambda v, b: v <= b, "<=")):
        bound = meta.get(op)
        if bound is not None and not test(value, bound):
            raise RecipeError(f"`{where}` in {src} must be {word} {bound}; got {value!r}")


def build_section(cls: type, data: Any, prefix: str, src: str) -> Any:
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
            raise RecipeError(f"unknown key `{where}` in {src}" + closest(
                f"{prefix}.{key}" if prefix else str(key), [f"{prefix}.{k}" if prefix else k for k in fields]))
        value = coerce(_yaml_word(value, fields[key].metadata), hints[key], where, src)
        _check_range(value, fields[key].metadata, where, src)
        kwargs[key] = value
    if cls is OutputConfig:
        _check_output_name(kwargs.get("name"), f"{prefix}.name" if prefix else "name", src)
    return cls(**kwargs)


def _check_output_name(name: Optional[str], where: str, src: str) -> None:
    """``output.name`` is one folder name under ``output.dir``: a path there (``../x``, ``/abs``)
    would put the run, and what ``--overwrite`` deletes, anywhere."""
    if name is None:
        return
    if name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise RecipeError(f"`{where}` in {src} is {name!r}: a run name is one folder name under output.dir "
                          f"(no `/`, not `.` or `..`); set output.dir for another parent folder")


def _build_objective(data: Any, prefix: str, src: str) -> ObjectiveConfig:
    """The objective's name and raw parameters. Checking them against the objective's constructor
    needs the objective classes, which live above this layer: ``pipelines.recipes.plan_for`` does it
    when it resolves the recipe into a plan."""
    if data is None:
        data = {}
    if isinstance(data, str):
        data = {"name": data}
    if not isinstance(data, Mapping):
        raise RecipeError(f"`{prefix}` in {src} must be a mapping with a `name`, got {data!r}")
    data = dict(data)
    name = data.pop("name", "ce")
    if not isinstance(name, str):
        raise RecipeError(f"`{prefix}.name` in {src} must be a string, got {name!r}")
    return ObjectiveConfig(name=name, params=data)


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
            if isinstance(node, dict) and keys[-1] in node:
                node.pop(keys[-1])
            elif ov[1:] not in (known := [*_dotted(Recipe), *_dotted(tree)]):
                # a key the recipe may hold but does not is already at its default; anything else is a typo
                raise RecipeError(f"override `{ov}`: there is no key `{ov[1:]}` to drop"
                                  + did_you_mean(ov[1:], known, cutoff=0.6))
            continue
        if "=" not in ov:
            raise RecipeError(f"override `{ov}` must look like key=value or ~key")
        key, raw = ov.split("=", 1)
        if not key or any(not k for k in key.split(".")):
            raise RecipeError(f"override `{ov}` has an empty key")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError as e:
            raise RecipeError(f"override `{ov}`: value is not valid YAML ({error_text(e)})") from None
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


def _dotted(section: Any, prefix: str = "") -> list[str]:
    """Every dotted key of a recipe class or plain tree (an objective's own parameters are free-form)."""
    if isinstance(section, dict):
        return [k for key, v in section.items() for k in (f"{prefix}{key}", *_dotted(v, f"{prefix}{key}."))]
    if not dataclasses.is_dataclass(section) or section is ObjectiveConfig:
        return []
    hints = typing.get_type_hints(section)
    return [k for f in dataclasses.fields(section) if not f.metadata.get("internal")
            for k in (f"{prefix}{f.name}", *_dotted(next((a for a in typing.get_args(hints[f.name]) or (hints[f.name],)
                                                            if dataclasses.is_dataclass(a)), None), f"{prefix}{f.name}."))]


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
    # Names as `finetune train -r` takes them: `scl`, `fewshot/scl` (sub-folders keep their prefix).
    known = sorted(q.relative_to(PACKAGED_RECIPES).with_suffix("").as_posix() for q in PACKAGED_RECIPES.rglob("*.yaml"))
    hint = did_you_mean(p.with_suffix("").as_posix() if p.suffix in (".yaml", ".yml") else str(recipe),
                        known, cutoff=0.75) or f"; packaged recipes: {', '.join(known)}"
    raise RecipeError(f"recipe file not found: {recipe}{hint}")


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise RecipeError(f"cannot read recipe {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise RecipeError(f"recipe {path} is not UTF-8 text (byte offset {e.start}); save it as UTF-8") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(e, "problem", None) or error_text(e)
        raise RecipeError(f"malformed YAML in {where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RecipeError(f"recipe {path} must be a YAML mapping at top level, got {type(data).__name__}")
    return data


def build_recipe(data: Mapping[str, Any], source: str = "<recipe>") -> Recipe:
    """Validate a plain nested dict into a :class:`Recipe`."""
    recipe = build_section(Recipe, data, "", source)
    recipe = dataclasses.replace(recipe, source=source)
    _cross_checks(recipe)
    return recipe


def read_recipe_source(path: str | Path | None, overrides: Sequence[str] = ()) -> tuple[dict[str, Any], str]:
    """The recipe's plain tree (YAML file or packaged name, or defaults when ``path`` is None) with
    the overrides applied, and the name errors should use for it."""
    if path is None:
        data, src = {}, "<command line>"
    else:
        data, src = read_yaml(resolve_recipe_path(path)), str(path)
    return apply_overrides(data, overrides), src


def is_probe_tree(data: Mapping[str, Any]) -> bool:
    return "probe" in data


def parse_recipe(path: str | Path | None, overrides: Sequence[str] = ()) -> Recipe:
    """Read a training recipe and apply overrides; the schema is checked, the objective's own
    parameters are not (see ``pipelines.recipes.load_plan``)."""
    data, src = read_recipe_source(path, overrides)
    if is_probe_tree(data):
        raise RecipeError(f"{src} is a probe recipe; run it with `finetune probe sequential` "
                          f"(or generalization, retention)")
    return build_recipe(data, src)


def _cross_checks(r: Recipe) -> None:
    d, src = r.data, r.source
    if d.dataset and (d.train or d.eval):
        raise RecipeError(f"`data.dataset` and `data.train`/`data.eval` in {src} are exclusive; use one")
    if d.eval_fraction is not None and d.eval is not None:
        raise RecipeError(f"`data.eval_fraction` and `data.eval` in {src} are exclusive: the evaluation rows come "
                          f"from the training data or from a file; use one")
    if d.few_shot and d.max_train_samples:
        raise RecipeError(f"`data.few_shot` and `data.max_train_samples` in {src} are exclusive; use one")
    if r.model.head_normalize and r.model.head == "native":  # (a labels head is always normalised)
        raise RecipeError(f"`model.head_normalize` in {src} applies to the pooled head only; set model.head=pooled "
                          f"(the native head is the architecture's own and reads the [CLS] state)")
    if r.model.head == "labels" and r.train.refit_head:
        raise RecipeError(f"`train.refit_head` in {src} refits a trained head; model.head=labels has none to refit "
                          f"(its weights are the label texts' embeddings): set train.refit_head=false")
    if d.label_descriptions and d.label_names:
        check_label_descriptions(d.label_descriptions, d.label_names, src)
    _check_trackers(r.train.report_to, src)
    _check_lora(r, src)
    try:
        codecs.lookup(d.encoding)
    except LookupError:
        raise RecipeError(f"`data.encoding` in {src} is `{d.encoding}`, not a text encoding Python knows "
                          f"(e.g. utf-8, latin-1, cp1252)") from None


def check_label_descriptions(descriptions: Mapping[str, str], labels: Sequence[str], src: str) -> None:
    """Every key of ``data.label_descriptions`` names a label, and no description is empty."""
    for key, text in descriptions.items():
        if key not in labels:
            raise RecipeError(f"`data.label_descriptions.{key}` in {src} names no label of the data"
                              + closest(str(key), [str(x) for x in labels], listing="labels"))
        if not str(text).strip():
            raise RecipeError(f"`data.label_descriptions.{key}` in {src} is empty; give a text or drop the key")


def _check_lora(r: Recipe, src: str) -> None:
    """LoRA trains adapters over the saved base weights: nothing may change those weights, and peft
    must be there (checked before any model loads)."""
    import importlib.util

    if r.model.lora is None:
        return
    if r.model.reinit_layers:
        raise RecipeError(f"`model.reinit_layers` and `model.lora` in {src} are exclusive: an adapter is saved "
                          f"over the base model's own weights, which re-initialised layers are not")
    if r.train.freeze_encoder:
        raise RecipeError(f"`train.freeze_encoder` and `model.lora` in {src} are exclusive: the adapters are in "
                          f"the encoder; drop model.lora to train the head alone")
    if importlib.util.find_spec("peft") is None:
        raise RecipeError(f"`model.lora` in {src} needs peft, which is not installed: pip install 'finetune-cli[lora]'")


def _check_trackers(names: Sequence[str], src: str) -> None:
    """Known tracker names whose package is installed; checked here so a missing package fails
    before any model loads (``find_spec`` imports nothing)."""
    import importlib.util

    for i, name in enumerate(names):
        if name not in TRACKERS:
            hint = did_you_mean(str(name), TRACKERS, cutoff=0.5)
            raise RecipeError(f"`train.report_to[{i}]` in {src}: unknown tracker {name!r} "
                              f"(choose from {', '.join(TRACKERS)}){hint}")
        if names.count(name) > 1:
            raise RecipeError(f"`train.report_to` in {src} lists {name} twice")
        if importlib.util.find_spec(TRACKERS[name]) is None:
            raise RecipeError(f"`train.report_to` in {src} asks for {name}, which is not installed: "
                              f"pip install 'finetune-cli[{name}]'")


# ---- probe recipes ----------------------------------------------------------------------------
# A *probe recipe* (``finetune probe``) is a :class:`Recipe` with a ``probe:`` section naming
# tasks (:class:`ProbeSection`) and no ``data``; each stage of a probe run trains an ordinary
# recipe built by :func:`probe_stage_recipe`.

def build_probe_recipe(data: Mapping[str, Any], source: str) -> Recipe:
    """Validate a probe recipe (a :class:`Recipe` with a ``probe`` section and no ``data``) with the
    recipe machinery (same errors, same suggestions)."""
    probe = data.get("probe")
    raw_tasks = probe.get("tasks") if isinstance(probe, Mapping) else None
    probe_raw = {k: v for k, v in probe.items() if k != "tasks"} if isinstance(probe, Mapping) else probe
    if data.get("data") is not None:
        raise RecipeError(f"`data` in {source}: a probe recipe names its data per task under `probe.tasks`")
    r = build_section(Recipe, {**{k: v for k, v in data.items() if k != "data"}, "probe": probe_raw or {}}, "",
                      source)
    if raw_tasks is None:
        raw_tasks = {}
    if not isinstance(raw_tasks, Mapping):
        raise RecipeError(f"`probe.tasks` in {source} must be a mapping of task name -> task, got {raw_tasks!r}")
    tasks = {}
    for name, t in raw_tasks.items():
        task = build_section(ProbeTask, t, f"probe.tasks.{name}", source)
        d = task.data
        if d.dataset is None and d.train is None and d.eval is None:
            raise RecipeError(f"`probe.tasks.{name}.data` in {source} names no data (set dataset, or train/eval)")
        if d.columns.label is None:
            raise RecipeError(f"`probe.tasks.{name}` in {source} has no label column; probes need labelled data")
        tasks[str(name)] = task
    r = dataclasses.replace(r, probe=dataclasses.replace(r.probe, tasks=tasks), source=source)
    for name in tasks:  # every stage recipe must validate too (same cross-checks as `finetune train`)
        probe_stage_recipe(r, name, Path("."), r.model.name)
    return r


def parse_probe_recipe(path: str | Path, overrides: Sequence[str] = ()) -> Recipe:
    """Read a probe recipe (schema checked; the objective's parameters as in :func:`parse_recipe`)."""
    data, src = read_recipe_source(path, overrides)
    if not is_probe_tree(data):
        raise RecipeError(f"recipe {path} has no `probe:` section (see recipes/probe_sequential.yaml)")
    return build_probe_recipe(data, src)


def task_data_config(task_dir: Path, meta: Mapping[str, Any]) -> DataConfig:
    """The data section of a stage that trains on a materialised probe task (``train.jsonl`` and
    ``eval.jsonl`` in ``task_dir``; ``meta`` as written by ``data.probe_tasks``)."""
    return DataConfig(train=str(task_dir / "train.jsonl"), eval=str(task_dir / "eval.jsonl"), format="jsonl",
                      label_names=list(meta["labels"]),
                      columns=dataclasses.replace(DataConfig().columns, text_pair="text_pair" if meta["pair"] else None))


def probe_stage_recipe(r: Recipe, task: str, run_dir: Path, model_name: str,
                       objective: Optional[ObjectiveConfig] = None, meta: Optional[Mapping[str, Any]] = None) -> Recipe:
    """The ordinary training recipe for one stage (validated like any other recipe)."""
    obj = objective or r.objective
    if meta is None:  # validation only: the task's own data section
        data = to_plain(r.probe.tasks[task].data)
    else:
        data = to_plain(task_data_config(Path(meta["dir"]), meta))
    tree = {"model": {**to_plain(r.model), "name": model_name}, "data": data,
            "objective": {"name": obj.name, **obj.params}, "train": to_plain(r.train),
            "output": {"dir": str(run_dir.parent), "name": run_dir.name}}
    return build_recipe(tree, f"{r.source} (stage {task})")
