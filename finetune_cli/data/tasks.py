"""From a :class:`~finetune_cli.recipe.DataConfig` to labelled train/eval tables.

Labels: class labels are mapped to ids (``data.label_names`` fixes the order; otherwise the hub's
ClassLabel names, otherwise the sorted labels of the training set — numerically when they are
all integers). Evaluation labels never seen in training are an error, as is a row without a label.

Label types: ``class`` (one label per row), ``float`` (a regression score), ``multi`` (a set of
labels per row: a JSONL list, or one string split at ``data.label_separator``; mapped to multi-hot
float vectors). A single-label row that looks like several labels (``pos,funny``) is refused
rather than made into a class of its own.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from finetune_cli.data import glue
from finetune_cli.data.sources import DATA_DIR_ENV, Table, invalid_text, is_missing, read_file, read_hub
from finetune_cli.errors import DataError
from finetune_cli.recipe import DataConfig


@dataclass
class TaskData:
    train: Optional[Table]
    eval: Optional[Table]
    label_names: Optional[list[str]]  # None for regression / unlabeled
    label_type: Optional[str]
    notes: list[str] = field(default_factory=list)  # e.g. rows dropped by data.drop_invalid
    # data.eval_fraction: how the training data was cut (see ``eval_split``); None without it
    split: Optional[dict[str, Any]] = None

    @property
    def num_labels(self) -> int:
        return len(self.label_names) if self.label_names else 0

    @property
    def id2label(self) -> dict[int, str]:
        return dict(enumerate(self.label_names or []))


def data_dir_from_env(explicit: Optional[str]) -> Optional[Path]:
    """The data folder: ``--data-dir`` (then exported as ``$FINETUNE_DATA_DIR`` for this process, so
    ``data:`` paths in the recipe resolve against it too), else ``$FINETUNE_DATA_DIR``, else None."""
    d = explicit or os.environ.get(DATA_DIR_ENV)
    if not d:
        return None
    p = Path(d).expanduser()
    if not p.is_dir():
        raise DataError(f"data directory not found: {d}")
    os.environ[DATA_DIR_ENV] = str(p)
    return p


def _needed(colmap: dict[str, Any], required: tuple[str, ...]) -> dict[str, Any]:
    """The entries of a column map the objective reads: its ``required`` columns and ``text_pair``."""
    return {k: v for k, v in colmap.items() if k in required or k == "text_pair"}


def _colmap(cfg: DataConfig, which: str, required: tuple[str, ...]) -> dict[str, Any]:
    """The column map of the train or eval file: ``data.eval_columns`` for the eval file when set."""
    columns = cfg.eval_columns if which == "eval" and cfg.eval_columns is not None else cfg.columns
    cm = {k: getattr(columns, k) for k in columns.__dataclass_fields__}
    return _needed({k: v for k, v in cm.items() if v is not None}, required)


def _read(cfg: DataConfig, which: str, data_dir: Optional[Path], required: tuple[str, ...]) -> Optional[Table]:
    colmap = _colmap(cfg, which, required)
    if cfg.dataset:
        name, config = glue.parse_dataset(cfg.dataset)
        task = glue.glue_task(name, config)
        split = cfg.train_split if which == "train" else cfg.eval_split
        if task is not None and data_dir is not None:
            path = glue.local_file(task, data_dir, split, cfg.train_split)
            t = read_file(str(path), _needed(task.local_cols, required), "tsv", task.header, encoding=cfg.encoding)
            if task.local_label_map and "label" in t.columns:
                t.columns["label"] = [task.local_label_map.get(str(v).strip(), v) for v in t.columns["label"]]
            t.label_names = list(task.label_names) if task.label_names else None
            return t
        return read_hub(name, config, split, _needed(task.hub_cols, required) if task is not None else colmap)
    path = cfg.train if which == "train" else cfg.eval
    if path is None:
        return None
    return read_file(path, colmap, cfg.format, cfg.header, encoding=cfg.encoding)


def _is_int(s: str) -> bool:
    try:
        int(s)
        return True
    except ValueError:
        return False


def _check_labels_present(t: Table) -> None:
    for i, v in enumerate(t.columns["label"]):
        if is_missing(v, ("nan",)):
            raise DataError(f"row {t.row(i)} of {t.source} has no label ({v!r}; unlabeled data cannot train this "
                            f"objective; data.drop_invalid=true drops such rows)")


def invalid_row(t: Table, i: int, text_columns: tuple[str, ...], label: bool) -> Optional[str]:
    """Why row ``i`` cannot be used (a missing label, a missing/empty/non-text text), or None."""
    for c in text_columns:
        if c in t.columns and (why := invalid_text(t.columns[c][i], c)) is not None:
            return why
    if label and "label" in t.columns and is_missing(t.columns["label"][i], ("nan",)):
        return f"has no label ({t.columns['label'][i]!r})"
    return None


def check_rows(t: Table, text_columns: tuple[str, ...], label: bool, drop: bool, notes: list[str]) -> Table:
    """Refuse (or, with ``drop``, drop and count) rows with a missing label or a bad text."""
    bad = [(i, why) for i in range(len(t)) if (why := invalid_row(t, i, text_columns, label)) is not None]
    if not bad:
        return t
    if not drop:
        i, why = bad[0]
        more = f" ({len(bad) - 1} more such rows)" if len(bad) > 1 else ""
        raise DataError(f"row {t.row(i)} of {t.source} {why}{more}; fix the data or set data.drop_invalid=true "
                        f"to drop such rows")
    keep = sorted(set(range(len(t))) - {i for i, _ in bad})
    if not keep:
        raise DataError(f"every row of {t.source} is invalid (e.g. row {t.row(bad[0][0])} {bad[0][1]})")
    notes.append(f"dropped {len(bad)} of {len(t)} rows of {t.source} (data.drop_invalid): first, row "
                 f"{t.row(bad[0][0])} {bad[0][1]}")
    return t.select(keep)


MULTI_SEPARATORS = (",", ";", "|")


def resolve_problem_type(cfg: DataConfig, requested: str) -> str:
    """``model.problem_type`` with ``auto`` resolved from the data section alone: multi-label when
    ``data.label_separator`` is set, regression for a GLUE task without classes (STS-B), else
    single-label classification."""
    if requested != "auto":
        return requested
    if cfg.label_separator:
        return "multi_label_classification"
    if cfg.dataset:
        name, config = glue.parse_dataset(cfg.dataset)
        task = glue.glue_task(name, config)
        if task is not None and task.label_names is None:
            return "regression"
    return "single_label_classification"


def _refuse_multi_labels(t: Table, raw: list[Any]) -> None:
    for i, v in enumerate(raw):
        several = isinstance(v, (list, tuple)) or any(s in str(v) for s in MULTI_SEPARATORS)
        if several:
            row = t.row(i)
            shown = ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v).strip()
            raise DataError(f"label `{shown}` in row {row} of {t.source} looks like several labels; for multi-label "
                            f"classification set model.problem_type=multi_label_classification (and "
                            f"data.label_separator=',' for joined strings), or list it in data.label_names if it is "
                            f"one class")


def _map_class_labels(train: Optional[Table], ev: Optional[Table], cfg: DataConfig) -> list[str]:
    for t in (train, ev):
        if t is not None:
            _check_labels_present(t)
            if not cfg.label_names:
                _refuse_multi_labels(t, t.columns["label"])
            t.columns["label"] = [str(v).strip() for v in t.columns["label"]]
    if cfg.label_names:
        names = list(cfg.label_names)
    elif train is not None and train.label_names:
        names = list(train.label_names)
    elif train is not None:
        uniq = sorted(set(train.columns["label"]))
        _refuse_scores_as_classes(train)
        names = sorted(uniq, key=int) if all(_is_int(u) for u in uniq) else uniq
    else:
        names = sorted(set(ev.columns["label"]))  # type: ignore[union-attr]
    index = {n: i for i, n in enumerate(names)}
    for t, what in ((train, "training"), (ev, "evaluation")):
        if t is None:
            continue
        ids = []
        for i, v in enumerate(t.columns["label"]):
            if v not in index:
                row = t.row(i)
                seen = "never seen in training" if what == "evaluation" else "not in data.label_names"
                raise DataError(f"label `{v}` in row {row} of {t.source} was {seen} (known: {', '.join(names)})")
            ids.append(index[v])
        t.columns["label"] = ids
    return names


def _label_set(v: Any, sep: Optional[str]) -> list[str]:
    if isinstance(v, (list, tuple)):
        return [str(x).strip() for x in v if str(x).strip()]
    if v is None:
        return []
    s = str(v).strip()
    if sep is None:
        return [s] if s else []
    return [x.strip() for x in s.split(sep) if x.strip()]


def _map_multi_labels(train: Optional[Table], ev: Optional[Table], cfg: DataConfig) -> list[str]:
    """Label sets -> multi-hot float vectors; returns the label names (id i = names[i])."""
    sets: dict[int, list[list[str]]] = {}
    for t in (train, ev):
        if t is not None:
            for i, v in enumerate(t.columns["label"]):
                if isinstance(v, (list, tuple)) and any(x is None or isinstance(x, (list, tuple, dict)) for x in v):
                    raise DataError(f"row {t.row(i)} of {t.source} has the label {v!r}: a multi-label row is a flat "
                                    f"list of labels (no nested lists, objects or nulls)")
            sets[id(t)] = [_label_set(v, cfg.label_separator) for v in t.columns["label"]]
    if cfg.label_names:
        names = list(cfg.label_names)
    else:
        src = train if train is not None else ev
        names = sorted({x for s in sets[id(src)] for x in s})  # type: ignore[arg-type]
    if not names:
        raise DataError("multi-label data has no labels at all")
    index = {n: i for i, n in enumerate(names)}
    for t in (train, ev):
        if t is None:
            continue
        vecs = []
        for i, s in enumerate(sets[id(t)]):
            v = [0.0] * len(names)
            for x in s:
                if x not in index:
                    row = t.row(i)
                    raise DataError(f"label `{x}` in row {row} of {t.source} was never seen in training "
                                    f"(known: {', '.join(names)})")
                v[index[x]] = 1.0
            vecs.append(v)
        t.columns["label"] = vecs
    return names


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _is_score(s: str) -> bool:
    return _is_number(s) and float(s) == float(s) and not float(s).is_integer()


def _refuse_scores_as_classes(t: Table) -> None:
    """Labels like ``3.8`` are regression scores: made into classes, every distinct score would
    become a class of its own. Refuse unless ``data.label_names`` says they are classes."""
    labels = t.columns["label"]
    if all(_is_number(v) for v in labels):
        for i, v in enumerate(labels):
            if _is_score(v):
                row = t.row(i)
                raise DataError(f"label `{v}` in row {row} of {t.source} is a regression score, but this objective "
                                f"needs class labels (use a regression objective, or set data.label_names if "
                                f"these numbers are class names)")


def _map_float_labels(t: Optional[Table]) -> None:
    if t is None:
        return
    _check_labels_present(t)
    out = []
    for i, v in enumerate(t.columns["label"]):
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise DataError(f"label `{v}` in row {t.row(i)} of {t.source} is not a number (this objective needs "
                            f"a regression score)") from None
        if not math.isfinite(f):
            raise DataError(f"label `{v}` in row {t.row(i)} of {t.source} is not a finite number (a gold score "
                            f"must be finite)")
        out.append(f)
    t.columns["label"] = out


def few_shot_indices(labels: list[int], n: int, seed: int) -> list[int]:
    """N examples per class, drawn without replacement with ``seed``; classes with fewer keep all."""
    rng = np.random.default_rng(seed)
    labels_arr = np.asarray(labels)
    keep: list[int] = []
    for c in sorted(set(labels)):
        idx = np.flatnonzero(labels_arr == c)
        keep.extend(rng.choice(idx, size=min(n, len(idx)), replace=False).tolist())
    return sorted(keep)


def stratified_eval_indices(labels: Optional[list[Any]], n: int, fraction: float, seed: int) -> list[int]:
    """The positions of the evaluation rows ``data.eval_fraction`` carves from ``n`` training rows.

    ``round(fraction * n)`` rows in all. With class ids (``labels``) every class gives its share:
    ``fraction * count_c`` rounded down, the rows left over going to the classes with the largest
    remainders (ties to the lower class id), so the evaluation part keeps the classes' proportions;
    which rows of a class go is a seeded draw. Without class ids (regression, multi-label), a seeded
    draw over all rows."""
    rng = np.random.default_rng(seed)
    total = int(round(fraction * n))
    if labels is None:
        return sorted(rng.permutation(n)[:total].tolist())
    arr = np.asarray(labels)
    classes = sorted(set(arr.tolist()))
    counts = np.array([(arr == c).sum() for c in classes])
    quota = fraction * counts
    take = np.floor(quota).astype(int)
    for j in sorted(range(len(classes)), key=lambda j: (-(quota[j] - take[j]), j))[: total - int(take.sum())]:
        take[j] += 1
    out: list[int] = []
    for c, k in zip(classes, take, strict=True):
        out.extend(rng.permutation(np.flatnonzero(arr == c))[:k].tolist())
    return sorted(out)


def eval_split(train: Table, fraction: float, seed: int, stratify: bool) -> tuple[Table, Table, dict[str, Any]]:
    """``(train part, evaluation part, record)``: ``data.eval_fraction`` of ``train`` held out. The
    record (``split.json`` of a run) holds the row numbers of both parts, as error messages give them."""
    n = len(train)
    ev_idx = stratified_eval_indices(train.columns["label"] if stratify else None, n, fraction, seed)
    if not ev_idx or len(ev_idx) == n:
        raise DataError(f"data.eval_fraction={fraction:g} of the {n} rows of {train.source} leaves "
                        f"{'no evaluation' if not ev_idx else 'no training'} rows; use a larger file or another "
                        f"fraction")
    held = set(ev_idx)
    tr_idx = [i for i in range(n) if i not in held]
    record = {"source": train.source, "rows": n, "eval_fraction": fraction, "seed": seed, "stratified": stratify,
              "train_rows": [train.row(i) for i in tr_idx], "eval_rows": [train.row(i) for i in ev_idx]}
    return train.select(tr_idx), train.select(ev_idx), record


def subsample(t: Table, n: int, seed: int) -> Table:
    if len(t) <= n:
        return t
    rng = np.random.default_rng(seed)
    return t.select(sorted(rng.choice(len(t), size=n, replace=False).tolist()))


def load_task_data(cfg: DataConfig, *, seed: int, label_type: Optional[str], required_columns: tuple[str, ...],
                   data_dir: Optional[Path] = None, need_train: bool = True, need_eval: bool = False,
                   min_classes: int = 1) -> TaskData:
    """Read, validate and label-map the train (and eval) data for an objective's contract."""
    if cfg.dataset is None and cfg.train is None and cfg.eval is None:
        raise DataError("the recipe names no data: set data.dataset (hub / GLUE task) or data.train and data.eval")
    if need_train and cfg.dataset is None and cfg.train is None:
        raise DataError("the recipe names no training data: set data.train (or data.dataset)")
    seed = cfg.seed if cfg.seed is not None else seed
    carve = cfg.eval_fraction is not None and (need_eval or need_train)
    train = _read(cfg, "train", data_dir, required_columns) if need_train or carve else None
    ev = None if carve else _read(cfg, "eval", data_dir, required_columns) if (
        need_eval or cfg.eval or cfg.dataset) else None
    if carve and train is None:
        raise DataError("data.eval_fraction carves the evaluation rows from the training data: set data.train "
                        "(or data.dataset)")
    if need_eval and ev is None and not carve:
        raise DataError("no evaluation data: set data.eval (or data.dataset with data.eval_split)")
    notes: list[str] = []
    text_cols = tuple(c for c in ("text", "text_pair", "hard_neg") if c in required_columns or c == "text_pair")
    checked: list[Optional[Table]] = []
    for t, what in ((train, "training"), (ev, "evaluation")):
        if t is not None and len(t) == 0:
            raise DataError(f"{what} data {t.source} is empty")
        if t is not None:
            for col in required_columns:
                if col not in t.columns:
                    raise DataError(f"{what} data {t.source} has no `{col}` column (set data.columns.{col})")
            t = check_rows(t, text_cols, label_type not in (None, "multi") and "label" in required_columns, cfg.drop_invalid,
                           notes)
        checked.append(t)
    train, ev = checked
    names: Optional[list[str]] = None
    if label_type == "class":
        names = _map_class_labels(train, ev, cfg)
        if train is not None and len(set(train.columns["label"])) < min_classes:
            raise DataError(f"training data {train.source} has {len(set(train.columns['label']))} class(es); "
                            f"this objective needs at least {min_classes}")
    elif label_type == "multi":
        names = _map_multi_labels(train, ev, cfg)
    elif label_type == "float":
        _map_float_labels(train)
        _map_float_labels(ev)
    split = None
    if carve:  # after label mapping (class ids to stratify by), before any sub-sampling of the train part
        assert train is not None and cfg.eval_fraction is not None
        train, ev, split = eval_split(train, cfg.eval_fraction, seed, stratify=label_type == "class")
        if not need_train:
            train = None
    if train is not None:
        if cfg.few_shot:
            if label_type != "class":
                raise DataError("data.few_shot needs class labels (N examples per class)")
            train = train.select(few_shot_indices(train.columns["label"], cfg.few_shot, seed))
        elif cfg.max_train_samples:
            train = subsample(train, cfg.max_train_samples, seed)
    if ev is not None and cfg.max_eval_samples:
        ev = subsample(ev, cfg.max_eval_samples, seed)
    return TaskData(train, ev, names, label_type, notes, split)
