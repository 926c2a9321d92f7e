"""Probe tasks on disk: each named task of a probe recipe read, split (seeded), subsampled and
written once as ``train.jsonl`` / ``eval.jsonl`` + ``task.json``, so every stage and every probe of
a ``finetune probe`` run reads exactly the same examples."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from finetune_cli.data import glue
from finetune_cli.data.tasks import load_task_data, subsample
from finetune_cli.errors import DataError
from finetune_cli.fsutil import atomic_write_json, atomic_write_text
from finetune_cli.recipe import DataConfig, ProbeTask, Recipe, RecipeError, closest


def _label_names_for(d: DataConfig) -> Optional[list[str]]:
    if d.label_names:
        return list(d.label_names)
    if d.dataset:
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


# ---- the protocol: stages and probed tasks ----------------------------------------------------

MODES = ("sequential", "generalization", "retention")


@dataclass
class Protocol:
    """Which task each stage trains on and which tasks are probed after each stage."""

    mode: str
    stages: list[str]  # task trained at each stage, in order
    probed: list[str]  # tasks probed after each stage (matrix columns)


def make_protocol(r: Recipe, mode: str, *, tasks: Optional[list[str]] = None, source: Optional[str] = None,
                  targets: Optional[list[str]] = None, cycles: Optional[int] = None) -> Protocol:
    known = list(r.probe.tasks)
    if not known:
        raise RecipeError(f"`probe.tasks` in {r.source} is empty; name at least one task")

    def check(names: list[str], what: str) -> list[str]:
        for n in names:
            if n not in r.probe.tasks:
                raise RecipeError(f"unknown task `{n}` in {what}" + closest(n, known, listing="tasks"))
        return names

    if mode == "sequential":
        seq = check(list(tasks or r.probe.sequence or known), "the task sequence")
        if len(seq) < 2:
            raise RecipeError(f"probe sequential needs at least two tasks; got {len(seq)} ({', '.join(seq)})")
        return Protocol(mode, seq, list(dict.fromkeys(seq)))
    if mode == "retention":
        seq = check(list(tasks or r.probe.sequence or known), "the task sequence")
        if len(set(seq)) < 2:
            raise RecipeError(f"probe retention needs at least two distinct tasks; got {', '.join(seq)}")
        k = cycles or r.probe.cycles
        return Protocol(mode, seq * k, list(dict.fromkeys(seq)))
    if mode == "generalization":
        src = source or r.probe.source or (tasks[0] if tasks else None)
        if src is None:
            raise RecipeError("probe generalization needs a source task (--source or probe.source)")
        check([src], "--source")
        tg = check(list(targets or r.probe.targets or [t for t in known if t != src]), "--targets")
        if not tg:
            raise RecipeError("probe generalization needs at least one target task besides the source")
        return Protocol(mode, [src], list(dict.fromkeys([src, *tg])))
    raise RecipeError(f"unknown probe mode `{mode}` (known: {', '.join(MODES)})")
