"""``finetune probe``: representational-collapse probes (Aghajanyan et al. 2020, arXiv:2008.03156).

A probe recipe (schema in ``recipe.py``) names tasks. Each *stage* fine-tunes on one task with the
one training engine (:func:`finetune_cli.pipelines.train.run_train`), starting from the previous
stage's ``final/`` encoder. After each stage the encoder is frozen and a linear probe
(``metrics.probe``) is fitted on every probed task's train part and scored on its eval part.

Layout of ``<output.dir>/<output.name>/``::

    probe_recipe.yaml            resolved probe recipe (a different one there is refused)
    tasks/<task>/{train,eval}.jsonl   the materialised (split, subsampled) task data
    <variant>/stage-NN-<task>/   a normal run directory per stage
    <variant>/probes/<stage>.json     probe accuracies after that stage (``pretrained`` = before any)
    results.json, accuracy.png   (the CLI adds results.md)

A stage is finished when its run has ``summary.json`` and its probe file exists; a rerun skips it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Optional

import numpy as np
import yaml

from finetune_cli.checkpoint import Checkpointer
from finetune_cli.data.probe_tasks import Protocol, materialize_task
from finetune_cli.data.sources import resolve_path
from finetune_cli.data.tasks import data_dir_from_env
from finetune_cli.engine.inference import InferenceSession, open_session
from finetune_cli.fsutil import atomic_write_json, atomic_write_text, check_apart, check_writable_dir
from finetune_cli.inputs import CWD, model_inputs
from finetune_cli.metrics.probe import linear_probe_accuracy, probe_summary
from finetune_cli.models.text_model import HeadSpec
from finetune_cli.pipelines.recipes import plan_for, validate_objective
from finetune_cli.pipelines.train import run_train
from finetune_cli.recipe import (
    ObjectiveConfig,
    Recipe,
    RecipeError,
    probe_stage_recipe,
    to_plain,
)
from finetune_cli.rundir import RunDir, same_job
from finetune_cli.viz.probe import plot_probe


def parse_variant(spec: str, where: str = "--objectives") -> ObjectiveConfig:
    """``ce`` or ``ce:label_smoothing=0.1:...`` -> a validated objective."""
    name, *kvs = spec.split(":")
    params: dict[str, Any] = {}
    for kv in kvs:
        if "=" not in kv:
            raise RecipeError(f"{where}: `{kv}` in `{spec}` must look like key=value")
        k, v = kv.split("=", 1)
        params[k] = yaml.safe_load(v)
    return validate_objective(ObjectiveConfig(name=name.strip(), params=params), "objective", where)


# ---- probes and stages -------------------------------------------------------------------------

def probe_encoder(model_name: str, tasks: dict[str, dict], r: Recipe, device: str = "auto") -> dict[str, float]:
    """Freeze the encoder at ``model_name`` and probe every task in ``tasks`` (name -> meta). It runs
    in the inference session, so on the device and in the precision (``train.precision``) the
    stages train in."""
    sess = open_session(model_name, device=device, precision=r.train.precision, max_length=r.model.max_length,
                        length_key="model.max_length", heads=HeadSpec(pooling=r.model.pooling, num_labels=0))
    return probe_model(sess, tasks, r)


def probe_model(sess: InferenceSession, tasks: dict[str, dict], r: Recipe) -> dict[str, float]:
    """Linear probes on the session model's pooled features; the encoder is only read (no_grad,
    eval mode)."""
    from finetune_cli.engine.rng import seed_everything

    for p in sess.model.parameters():
        p.requires_grad_(False)
    cc = r.probe.classifier
    out = {}
    for name, meta in tasks.items():
        d = Path(meta["dir"])
        xtr, ytr = sess.file_features(d / "train.jsonl", meta["pair"], cc.batch_size)
        xev, yev = sess.file_features(d / "eval.jsonl", meta["pair"], cc.batch_size)
        n = r.probe.tasks[name].probe_train_samples
        if n and n < len(ytr):
            idx = np.sort(np.random.default_rng(r.train.seed).choice(len(ytr), size=n, replace=False))
            xtr, ytr = xtr[idx], [ytr[i] for i in idx]
        seed_everything(r.train.seed)
        out[name] = linear_probe_accuracy(xtr, ytr, xev, yev, cc.C, cc.max_iter, r.train.seed)
    return out


def _check_out_dir(r: Recipe, out: Path, overwrite: bool) -> None:
    inputs = [*model_inputs(r.model.name), *((f"data of task {name}", resolve_path(f)) for name, t in r.probe.tasks.items()
                                              for f in (t.data.train, t.data.eval) if f and not f.startswith("data:"))]
    check_apart(out, inputs, "output folder", around=CWD)
    stored = out / "probe_recipe.yaml"
    job = r.to_dict()
    old = yaml.safe_load(stored.read_text(encoding="utf-8")) if stored.is_file() else None
    if not same_job(Path(f"output directory {out}"), old, job, kind="probe run", overwrite=overwrite,
                    remedy="pass --overwrite to replace it, or set output.name") and old is not None:
        shutil.rmtree(out)
    check_writable_dir(out, "output folder")
    atomic_write_text(stored, yaml.safe_dump(job, sort_keys=False))


def run_probe(r: Recipe, plan: Protocol, ui, *, variants: Optional[list[str]] = None, device: str = "auto",
              data_dir: Optional[str] = None, overwrite: bool = False) -> dict[str, Any]:
    objectives = [(v, parse_variant(v)) for v in variants] if variants else [(r.objective.name, r.objective)]
    labels = [v for v, _ in objectives]
    if len(set(labels)) != len(labels):
        raise RecipeError(f"--objectives names the same variant twice ({', '.join(labels)})")
    out = r.run_dir
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
                               "probe": to_plain(r.probe.classifier), "variants": {}}
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
            run = RunDir(vdir / f"stage-{i:02d}-{task}")
            pfile = pdir / f"stage-{i:02d}-{task}.json"
            done = run.is_complete() and pfile.is_file()
            if done:
                ui.log(f"[{label}] stage {i} ({task}) already finished; skipping")
            else:
                sr = probe_stage_recipe(r, task, run.path, prev, obj, metas[task])
                ui.log(f"[{label}] stage {i}: fine-tune on {task} from {prev}")
                run_train(plan_for(sr), ui, device=device, data_dir=data_dir, overwrite=False)
                if not r.probe.keep_checkpoints:  # the stage is complete: final/ is what the next stage reads
                    Checkpointer(run).prune(keep=0, protect=-1)
                atomic_write_json(pfile, probe_encoder(str(run.final), probed, r, device))
            rows.append(json.loads(pfile.read_text()))
            runs.append(str(run))
            prev = str(run.final)
        matrix = [[row[t] for t in plan.probed] for row in rows]
        results["variants"][label] = {"objective": {"name": obj.name, **obj.params}, "runs": runs,
                                      "matrix": matrix,
                                      **probe_summary(plan.mode, plan.stages, plan.probed, matrix)}
    atomic_write_json(out / "results.json", results)
    plot_probe(results, out / "accuracy.png")
    results["out_dir"] = str(out)
    return results


def _safe(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in label)
