"""``finetune probe``: representational-collapse probes (Aghajanyan et al. 2020, arXiv:2008.03156).

A *probe recipe* is an ordinary recipe (model, objective, train, output) plus a ``probe:`` section
naming tasks. Each *stage* fine-tunes on one task with the one training engine
(:func:`finetune_cli.pipelines.train.run_train`), starting from the previous stage's ``final/``
encoder. After each stage the encoder is frozen and a linear probe — scikit-learn logistic
regression on standardised pooled features, a fixed ``max_iter`` budget — is fitted on every
probed task's train part and scored on its eval part.

Layout of ``<output.dir>/<output.name>/``::

    probe_recipe.yaml            resolved probe recipe (a different one there is refused)
    tasks/<task>/{train,eval}.jsonl   the materialised (split, subsampled) task data
    <variant>/stage-NN-<task>/   a normal run directory per stage
    <variant>/probes/<stage>.json     probe accuracies after that stage (``pretrained`` = before any)
    results.json, results.md, accuracy.png

A stage is finished when its run has ``summary.json`` and its probe file exists; a rerun skips it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import yaml

from finetune_cli.errors import DataError, RunDirError
from finetune_cli.fsutil import atomic_write_json, atomic_write_text
from finetune_cli.recipe import (
    DataConfig,
    ModelConfig,
    ObjectiveConfig,
    OutputConfig,
    Recipe,
    RecipeError,
    TrainConfig,
    _build,
    _build_objective,
    _f,
    apply_overrides,
    build_recipe,
    read_yaml,
    resolve_recipe_path,
)

MODES = ("sequential", "generalization", "retention")


# ---- schema -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class SplitConfig:
    """Make a train/eval pair from one split (e.g. QNLI has only dev, QQP only a train slice)."""

    source: Optional[str] = _f(None, choices=("train", "eval"), help="which split to cut in two; None = no cut")
    eval_fraction: float = _f(0.2, gt=0.0, lt=1.0)
    seed: Optional[int] = _f(None, help="default: the task's data.seed, then train.seed")


@dataclass(frozen=True)
class ProbeTask:
    """One named task: where its data is, and how much of it the stages and probes use."""

    data: DataConfig = _f(default_factory=DataConfig)
    split: SplitConfig = _f(default_factory=SplitConfig, help="cut one split into train/eval (seeded)")
    probe_train_samples: Optional[int] = _f(None, gt=0, help="fit the probe on at most N train examples")


@dataclass(frozen=True)
class ClassifierConfig:
    """The linear probe: L2 logistic regression on standardised pooled features."""

    C: float = _f(1.0, gt=0)
    max_iter: int = _f(200, gt=0, help="fixed L-BFGS budget")
    batch_size: int = _f(128, gt=0, help="feature-extraction batch size")


@dataclass(frozen=True)
class ProbeSection:
    tasks: dict = _f(default_factory=dict, help="name -> task")
    sequence: list[str] = _f(default_factory=list, help="sequential: the task order (default: all tasks)")
    source: Optional[str] = _f(None, help="generalization: the task to fine-tune on")
    targets: list[str] = _f(default_factory=list, help="generalization: tasks probed (default: the others)")
    cycles: int = _f(2, gt=0, help="retention: passes over the sequence")
    keep_checkpoints: bool = _f(False, help="keep a finished stage's checkpoint-*/ folders (only needed to resume a stage)")
    classifier: ClassifierConfig = _f(default_factory=ClassifierConfig)


@dataclass(frozen=True)
class ProbeRecipe:
    model: ModelConfig = field(default_factory=ModelConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    probe: ProbeSection = field(default_factory=ProbeSection)
    source: str = field(default="<defaults>", compare=False, metadata={"internal": True})

    @property
    def out_dir(self) -> Path:
        name = self.output.name or (Path(self.source).stem if self.source.endswith((".yaml", ".yml")) else "probe")
        return Path(self.output.dir) / name

    def to_dict(self) -> dict[str, Any]:
        from finetune_cli.recipe import _to_plain

        return _to_plain(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=False)


def build_probe_recipe(data: dict[str, Any], source: str) -> ProbeRecipe:
    """Validate with the recipe machinery (same errors, same suggestions)."""
    raw_tasks = (data.get("probe") or {}).get("tasks") if isinstance(data.get("probe"), dict) else None
    probe_raw = dict(data.get("probe") or {}) if isinstance(data.get("probe"), dict) else data.get("probe")
    if isinstance(probe_raw, dict):
        probe_raw.pop("tasks", None)
    r = _build(ProbeRecipe, {**data, "probe": probe_raw}, "", source)
    if raw_tasks is None:
        raw_tasks = {}
    if not isinstance(raw_tasks, dict):
        raise RecipeError(f"`probe.tasks` in {source} must be a mapping of task name -> task, got {raw_tasks!r}")
    tasks = {}
    for name, t in raw_tasks.items():
        task = _build(ProbeTask, t, f"probe.tasks.{name}", source)
        d = task.data
        if d.dataset is None and d.train is None and d.eval is None:
            raise RecipeError(f"`probe.tasks.{name}.data` in {source} names no data (set dataset, or train/eval)")
        if d.columns.label is None:
            raise RecipeError(f"`probe.tasks.{name}` in {source} has no label column; probes need labelled data")
        tasks[str(name)] = task
    r = dataclasses.replace(r, probe=dataclasses.replace(r.probe, tasks=tasks), source=source)
    # the per-stage recipe must validate too (same cross-checks as `finetune train`)
    for name in tasks:
        stage_recipe(r, name, Path("."), r.model.name)
    return r


def load_probe_recipe(path: str | Path, overrides: list[str] | tuple = ()) -> ProbeRecipe:
    data = apply_overrides(read_yaml(resolve_recipe_path(path)), overrides)
    if "probe" not in data:
        raise RecipeError(f"recipe {path} has no `probe:` section (see recipes/probe_sequential.yaml)")
    if data.get("data") is not None:
        raise RecipeError(f"`data` in {path}: a probe recipe names its data per task under `probe.tasks`")
    data.pop("data", None)
    return build_probe_recipe(data, str(path))


def parse_variant(spec: str, where: str = "--objectives") -> ObjectiveConfig:
    """``ce`` or ``ce:label_smoothing=0.1:...`` -> a validated objective."""
    name, *kvs = spec.split(":")
    params: dict[str, Any] = {}
    for kv in kvs:
        if "=" not in kv:
            raise RecipeError(f"{where}: `{kv}` in `{spec}` must look like key=value")
        k, v = kv.split("=", 1)
        params[k] = yaml.safe_load(v)
    return _build_objective({"name": name.strip(), **params}, "objective", where)


# ---- protocol ---------------------------------------------------------------------------------

@dataclass
class Plan:
    mode: str
    stages: list[str]  # task trained at each stage, in order
    probed: list[str]  # tasks probed after each stage (matrix columns)


def make_plan(r: ProbeRecipe, mode: str, *, tasks: Optional[list[str]] = None, source: Optional[str] = None,
              targets: Optional[list[str]] = None, cycles: Optional[int] = None) -> Plan:
    known = list(r.probe.tasks)
    if not known:
        raise RecipeError(f"`probe.tasks` in {r.source} is empty; name at least one task")

    def check(names: list[str], what: str) -> list[str]:
        from finetune_cli.recipe import _closest

        for n in names:
            if n not in r.probe.tasks:
                raise RecipeError(f"unknown task `{n}` in {what}" + _closest(n, known).replace("valid keys", "tasks"))
        return names

    if mode == "sequential":
        seq = check(list(tasks or r.probe.sequence or known), "the task sequence")
        if len(seq) < 2:
            raise RecipeError(f"probe sequential needs at least two tasks; got {len(seq)} ({', '.join(seq)})")
        return Plan(mode, seq, list(dict.fromkeys(seq)))
    if mode == "retention":
        seq = check(list(tasks or r.probe.sequence or known), "the task sequence")
        if len(set(seq)) < 2:
            raise RecipeError(f"probe retention needs at least two distinct tasks; got {', '.join(seq)}")
        k = cycles or r.probe.cycles
        return Plan(mode, seq * k, list(dict.fromkeys(seq)))
    if mode == "generalization":
        src = source or r.probe.source or (tasks[0] if tasks else None)
        if src is None:
            raise RecipeError("probe generalization needs a source task (--source or probe.source)")
        check([src], "--source")
        tg = check(list(targets or r.probe.targets or [t for t in known if t != src]), "--targets")
        if not tg:
            raise RecipeError("probe generalization needs at least one target task besides the source")
        return Plan(mode, [src], list(dict.fromkeys([src, *tg])))
    raise RecipeError(f"unknown probe mode `{mode}` (known: {', '.join(MODES)})")


# ---- data -------------------------------------------------------------------------------------

def _label_names_for(d: DataConfig) -> Optional[list[str]]:
    if d.label_names:
        return list(d.label_names)
    if d.dataset:
        from finetune_cli.data import glue

        name, config = glue.parse_dataset(d.dataset)
        task = glue.glue_task(name, config)
        if task is not None and task.label_names:
            return list(task.label_names)
    return None


def _write_jsonl(path: Path, table, names: list[str]) -> None:
    cols = [c for c in ("text", "text_pair") if c in table.columns]
    lines = []
    for i in range(len(table)):
        rec = {c: str(table.columns[c][i]) for c in cols}
        rec["label"] = names[table.columns["label"][i]]
        lines.append(json.dumps(rec, ensure_ascii=False))
    atomic_write_text(path, "\n".join(lines) + "\n")


def materialize_task(name: str, task: ProbeTask, out: Path, seed: int, data_dir: Optional[Path]) -> dict[str, Any]:
    """Read, split (seeded), subsample and write ``out/{train,eval}.jsonl``; return their description."""
    from finetune_cli.data.tasks import load_task_data, subsample

    meta_file = out / "task.json"
    if meta_file.is_file() and (out / "train.jsonl").is_file() and (out / "eval.jsonl").is_file():
        return json.loads(meta_file.read_text())
    d = task.data
    d = dataclasses.replace(d, label_names=_label_names_for(d))
    s = d.seed if d.seed is not None else seed
    required = ("text", "label")
    try:
        if task.split.source is None:
            td = load_task_data(d, seed=seed, label_type="class", required_columns=required, data_dir=data_dir,
                                need_train=True, need_eval=True, min_classes=2)
            train, ev = td.train, td.eval
        else:
            sp = task.split
            raw = dataclasses.replace(d, few_shot=None, max_train_samples=None, max_eval_samples=None)
            if sp.source == "train":
                raw = dataclasses.replace(raw, eval=None, eval_split=raw.train_split)
                td = load_task_data(raw, seed=seed, label_type="class", required_columns=required,
                                    data_dir=data_dir, need_train=True, min_classes=2)
                whole = td.train
            else:
                raw = dataclasses.replace(raw, train=None)
                td = load_task_data(raw, seed=seed, label_type="class", required_columns=required,
                                    data_dir=data_dir, need_train=False, need_eval=True)
                whole = td.eval
            rng = np.random.default_rng(sp.seed if sp.seed is not None else s)
            perm = rng.permutation(len(whole))
            n_eval = max(1, int(round(sp.eval_fraction * len(whole))))
            ev = whole.select(sorted(perm[:n_eval].tolist()))
            train = whole.select(sorted(perm[n_eval:].tolist()))
            if d.max_train_samples:
                train = subsample(train, d.max_train_samples, s)
            if d.max_eval_samples:
                ev = subsample(ev, d.max_eval_samples, s)
    except DataError as e:
        raise DataError(f"task `{name}`: {e}") from None
    names = td.label_names or []
    if len(set(train.columns["label"])) < 2:
        raise DataError(f"task `{name}`: the train part has fewer than two classes; a probe needs two")
    out.mkdir(parents=True, exist_ok=True)
    _write_jsonl(out / "train.jsonl", train, names)
    _write_jsonl(out / "eval.jsonl", ev, names)
    meta = {"task": name, "train": len(train), "eval": len(ev), "labels": names,
            "pair": "text_pair" in train.columns}
    atomic_write_json(meta_file, meta)
    return meta


def task_data_config(out: Path, meta: dict[str, Any]) -> DataConfig:
    return DataConfig(train=str(out / "train.jsonl"), eval=str(out / "eval.jsonl"), format="jsonl",
                      label_names=list(meta["labels"]),
                      columns=dataclasses.replace(DataConfig().columns, text_pair="text_pair" if meta["pair"] else None))


def stage_recipe(r: ProbeRecipe, task: str, run_dir: Path, model_name: str,
                 objective: Optional[ObjectiveConfig] = None, meta: Optional[dict] = None) -> Recipe:
    """The ordinary training recipe for one stage (validated like any other recipe)."""
    obj = objective or r.objective
    if meta is None:  # validation only: the task's own data section
        data = _plain(r.probe.tasks[task].data)
    else:
        data = _plain(task_data_config(Path(meta["dir"]), meta))
    tree = {"model": {**_plain(r.model), "name": model_name}, "data": data,
            "objective": {"name": obj.name, **obj.params}, "train": _plain(r.train),
            "output": {"dir": str(run_dir.parent), "name": run_dir.name}}
    return build_recipe(tree, f"{r.source} (stage {task})")


def _plain(x: Any) -> Any:
    from finetune_cli.recipe import _to_plain

    return _to_plain(x)


# ---- probes -----------------------------------------------------------------------------------

def extract_features(model, tokenizer, path: Path, pair: bool, max_length: int, batch_size: int):
    from finetune_cli.data.encode import encode_table
    from finetune_cli.data.sources import read_file
    from finetune_cli.engine.inference import forward_all

    cm = {"text": "text", "label": "label", **({"text_pair": "text_pair"} if pair else {})}
    t = read_file(str(path), cm, "jsonl")
    labels = [str(v) for v in t.columns.pop("label")]
    cols = ("text", "text_pair") if pair else ("text",)
    enc = encode_table(t, tokenizer, max_length, cols, joint=True)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    feats = forward_all(model, enc, batch_size, pad, want=("embeddings",))["embeddings"]
    return feats, labels


def fit_probe(xtr: np.ndarray, ytr: list[str], xev: np.ndarray, yev: list[str], c: float, max_iter: int,
              seed: int) -> float:
    """Standardise, fit L2 logistic regression (fixed budget), return eval accuracy."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    sc = StandardScaler().fit(xtr)
    clf = LogisticRegression(C=c, max_iter=max_iter, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(sc.transform(xtr), ytr)
    return float((clf.predict(sc.transform(xev)) == np.asarray(yev)).mean())


def probe_encoder(model_name: str, tasks: dict[str, dict], r: ProbeRecipe, device: str = "auto") -> dict[str, float]:
    """Freeze the encoder at ``model_name`` and probe every task in ``tasks`` (name -> meta)."""
    import torch

    from finetune_cli.models.loading import load_text_model
    from finetune_cli.models.text_model import HeadSpec

    model, tokenizer, _ = load_text_model(model_name, HeadSpec(pooling=r.model.pooling, num_labels=0))
    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else ("cpu" if device == "auto" else device))
    return probe_model(model.to(dev), tokenizer, tasks, r)


def probe_model(model, tokenizer, tasks: dict[str, dict], r: ProbeRecipe) -> dict[str, float]:
    """Linear probes on ``model``'s pooled features; the encoder is only read (no_grad, eval mode)."""
    from finetune_cli.engine.trainer import seed_everything

    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    cc = r.probe.classifier
    out = {}
    for name, meta in tasks.items():
        d = Path(meta["dir"])
        xtr, ytr = extract_features(model, tokenizer, d / "train.jsonl", meta["pair"], r.model.max_length, cc.batch_size)
        xev, yev = extract_features(model, tokenizer, d / "eval.jsonl", meta["pair"], r.model.max_length, cc.batch_size)
        n = r.probe.tasks[name].probe_train_samples
        if n and n < len(ytr):
            idx = np.sort(np.random.default_rng(r.train.seed).choice(len(ytr), size=n, replace=False))
            xtr, ytr = xtr[idx], [ytr[i] for i in idx]
        seed_everything(r.train.seed)
        out[name] = fit_probe(xtr, ytr, xev, yev, cc.C, cc.max_iter, r.train.seed)
    return out


# ---- running ----------------------------------------------------------------------------------

def _check_out_dir(r: ProbeRecipe, out: Path, overwrite: bool) -> None:
    stored = out / "probe_recipe.yaml"
    text = yaml.safe_dump(r.to_dict(), sort_keys=False)
    if stored.is_file() and stored.read_text() != text:
        if not overwrite:
            raise RunDirError(f"output directory {out} holds a different probe run; pass --overwrite or set output.name")
        import shutil

        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(stored, text)


def run_probe(r: ProbeRecipe, plan: Plan, ui, *, variants: Optional[list[str]] = None, device: str = "auto",
              data_dir: Optional[str] = None, overwrite: bool = False) -> dict[str, Any]:
    from finetune_cli.data.tasks import data_dir_from_env
    from finetune_cli.pipelines.train import run_train

    objectives = [(v, parse_variant(v)) for v in variants] if variants else [(r.objective.name, r.objective)]
    labels = [v for v, _ in objectives]
    if len(set(labels)) != len(labels):
        raise RecipeError(f"--objectives names the same variant twice ({', '.join(labels)})")
    out = r.out_dir
    _check_out_dir(r, out, overwrite)
    ddir = data_dir_from_env(data_dir)
    metas = {}
    for name in dict.fromkeys([*plan.stages, *plan.probed]):
        m = materialize_task(name, r.probe.tasks[name], out / "tasks" / name, r.train.seed, ddir)
        metas[name] = {**m, "dir": str(out / "tasks" / name)}
    for name, m in metas.items():  # logged once every task's data is known to be good
        ui.log(f"task {name}: {m['train']} train / {m['eval']} eval; labels {', '.join(m['labels'])}")
    probed = {t: metas[t] for t in plan.probed}

    results: dict[str, Any] = {"mode": plan.mode, "stages": ["pretrained", *plan.stages], "tasks": plan.probed,
                               "probe": _plain(r.probe.classifier), "variants": {}}
    for label, obj in objectives:
        vdir = out / _safe(label)
        pdir = vdir / "probes"
        pdir.mkdir(parents=True, exist_ok=True)
        rows = []
        base_file = pdir / "pretrained.json"
        if not base_file.is_file():
            ui.log(f"[{label}] probing the pretrained encoder")
            atomic_write_json(base_file, probe_encoder(r.model.name, probed, r, device))
        rows.append(json.loads(base_file.read_text()))
        prev = r.model.name
        runs = []
        for i, task in enumerate(plan.stages):
            run_dir = vdir / f"stage-{i:02d}-{task}"
            pfile = pdir / f"stage-{i:02d}-{task}.json"
            done = (run_dir / "summary.json").is_file() and pfile.is_file()
            if done:
                ui.log(f"[{label}] stage {i} ({task}) already finished; skipping")
            else:
                sr = stage_recipe(r, task, run_dir, prev, obj, metas[task])
                ui.log(f"[{label}] stage {i}: fine-tune on {task} from {prev}")
                run_train(sr, ui, device=device, data_dir=data_dir, overwrite=False)
                if not r.probe.keep_checkpoints:  # the stage is complete: final/ is what the next stage reads
                    import shutil

                    from finetune_cli.engine import list_checkpoints

                    for ck in list_checkpoints(run_dir):
                        shutil.rmtree(ck, ignore_errors=True)
                atomic_write_json(pfile, probe_encoder(str(run_dir / "final"), probed, r, device))
            rows.append(json.loads(pfile.read_text()))
            runs.append(str(run_dir))
            prev = str(run_dir / "final")
        matrix = [[row[t] for t in plan.probed] for row in rows]
        results["variants"][label] = {"objective": {"name": obj.name, **obj.params}, "runs": runs,
                                      "matrix": matrix, **summarise(plan, matrix)}
    atomic_write_json(out / "results.json", results)
    atomic_write_text(out / "results.md", markdown_table(results))
    from finetune_cli.viz.probe import plot_probe

    plot_probe(results, out / "accuracy.png")
    results["out_dir"] = str(out)
    return results


def _safe(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in label)


def summarise(plan: Plan, matrix: list[list[float]]) -> dict[str, Any]:
    """Degradation: for each task, its accuracy right after it was (last) trained minus at the end;
    generalization: fine-tuned minus pretrained; retention: accuracy each time a task comes back."""
    m = np.asarray(matrix)
    cols = {t: j for j, t in enumerate(plan.probed)}
    res: dict[str, Any] = {}
    if plan.mode == "generalization":
        res["delta_vs_pretrained"] = {t: float(m[-1, j] - m[0, j]) for t, j in cols.items()}
        return res
    deg = {}
    for t, j in cols.items():
        trained = [i + 1 for i, s in enumerate(plan.stages) if s == t]
        if trained:
            deg[t] = float(m[trained[-1], j] - m[-1, j])
    res["degradation"] = deg
    earlier = [deg[t] for t in dict.fromkeys(plan.stages[:-1]) if t in deg and t != plan.stages[-1]]
    res["mean_degradation_earlier"] = float(np.mean(earlier)) if earlier else 0.0
    if plan.mode == "retention":
        ret = []
        for i, s in enumerate(plan.stages):
            prev = [k for k in range(i) if plan.stages[k] == s]
            if prev:
                j = cols[s]
                ret.append({"stage": i, "task": s, "after_last_training": float(m[prev[-1] + 1, j]),
                            "when_it_comes_back": float(m[i, j]), "after_retraining": float(m[i + 1, j])})
        res["returns"] = ret
    return res


def markdown_table(results: dict[str, Any]) -> str:
    tasks = results["tasks"]
    lines = [f"# probe {results['mode']}: linear-probe accuracy (stage x task)", ""]
    lines.append("| variant | stage | " + " | ".join(tasks) + " |")
    lines.append("|---|---|" + "---|" * len(tasks))
    for label, v in results["variants"].items():
        for stage, row in zip(results["stages"], v["matrix"], strict=False):
            lines.append(f"| {label} | {stage} | " + " | ".join(f"{x:.4f}" for x in row) + " |")
    lines.append("")
    for label, v in results["variants"].items():
        if "degradation" in v:
            lines.append(f"- {label}: degradation (after own stage - final) "
                         + ", ".join(f"{t} {d:+.4f}" for t, d in v["degradation"].items())
                         + f"; mean over earlier tasks {v['mean_degradation_earlier']:+.4f}")
        if "delta_vs_pretrained" in v:
            lines.append(f"- {label}: fine-tuned - pretrained "
                         + ", ".join(f"{t} {d:+.4f}" for t, d in v["delta_vs_pretrained"].items()))
    return "\n".join(lines) + "\n"
