"""Experiment trackers (TensorBoard, MLflow, trackio, W&B) through ``accelerate``'s tracking API.

The trainer hands ``accelerate.Accelerator(log_with=..., project_dir=<run>/tracking)`` the names in
``train.report_to``; this module starts the runs (``init_trackers`` with the resolved recipe
flattened into hyper-parameters), and closes them. Every record that goes into ``metrics.jsonl``
also goes to ``accelerator.log`` (main process only: accelerate's trackers check that themselves).

Where each tracker writes:

- tensorboard: ``<run>/tracking/<project>/`` (event files; ``tensorboard --logdir runs`` finds them);
- mlflow: ``MLFLOW_TRACKING_URI`` when set (a server), else the SQLite store
  ``<run>/tracking/mlflow.db`` with artifacts in ``<run>/tracking/mlartifacts`` (MLflow 3 refuses
  the old ``./mlruns`` file store by default); the run id is kept in ``<run>/tracking/mlflow_run_id``
  so a resumed training logs into the same MLflow run;
- trackio, wandb: their own configuration (``WANDB_MODE=offline`` etc.), project ``<project>``.

``<project>`` is the run's folder name, or for ``seed-<k>`` runs the folder above it, so the seeds
of one recipe share a project and differ by run name.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from finetune_cli.ui import is_main_process

TRACKING_DIR = "tracking"
MLFLOW_RUN_ID = "mlflow_run_id"


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"train": {"lr": 1e-3}}`` -> ``{"train.lr": 1e-3}``; values a tracker's hyper-parameter table
    takes (bool, int, float, str): None becomes ``"null"``, lists become JSON text."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping):
            out.update(flatten(v, key))
        elif v is None:
            out[key] = "null"
        elif isinstance(v, (bool, int, float, str)):
            out[key] = v
        else:
            out[key] = json.dumps(v, default=str)
    return out


def loggable(record: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a ``metrics.jsonl`` record, ``step`` left out (it is the x axis)."""
    return {k: v for k, v in record.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}


def project_and_run(run_dir: Path) -> tuple[str, str]:
    run_dir = Path(run_dir)
    if re.fullmatch(r"seed-(-?\d+)", run_dir.name) and run_dir.parent.name:
        return run_dir.parent.name, run_dir.name
    return run_dir.name, run_dir.name


def accelerator_kwargs(report_to: list[str], run_dir: Path) -> dict[str, Any]:
    """Extra ``Accelerator(...)`` arguments: none without trackers (so nothing changes for a run
    that does not track)."""
    if not report_to:
        return {}
    return {"log_with": list(report_to), "project_dir": str(Path(run_dir) / TRACKING_DIR)}


def start(acc, report_to: list[str], run_dir: Path, hparams: Mapping[str, Any], resuming: bool) -> None:
    """``init_trackers`` with per-tracker settings; call on every process (accelerate starts the
    trackers on the main process only)."""
    if not report_to:
        return
    track_dir = Path(run_dir) / TRACKING_DIR
    project, run_name = project_and_run(run_dir)
    init: dict[str, dict[str, Any]] = {}
    if "mlflow" in report_to:
        run_id_file = track_dir / MLFLOW_RUN_ID
        if is_main_process():
            import mlflow

            if not os.environ.get("MLFLOW_TRACKING_URI"):
                track_dir.mkdir(parents=True, exist_ok=True)
                mlflow.set_tracking_uri(f"sqlite:///{track_dir.resolve() / 'mlflow.db'}")
        init["mlflow"] = {"run_name": run_name, "logging_dir": str((track_dir / "mlartifacts").resolve())}
        if resuming and run_id_file.is_file():
            init["mlflow"]["run_id"] = run_id_file.read_text().strip()
    if "wandb" in report_to:
        init["wandb"] = {"name": run_name, "dir": str(track_dir)}
    if "trackio" in report_to:
        init["trackio"] = {"name": run_name}
    acc.init_trackers(project, config=flatten(hparams), init_kwargs=init)
    if "mlflow" in report_to and is_main_process():
        run = acc.get_tracker("mlflow", unwrap=True)
        track_dir.mkdir(parents=True, exist_ok=True)
        (track_dir / MLFLOW_RUN_ID).write_text(run.info.run_id + "\n")


def log(acc, record: Mapping[str, Any]) -> None:
    if getattr(acc, "trackers", None):
        acc.log(loggable(record), step=int(record["step"]))


def finish(acc) -> None:
    """Close every tracker. Not ``acc.end_training()``: that also destroys the process group, which
    a multi-seed run or a sweep under a launcher still needs for its next training."""
    for t in getattr(acc, "trackers", []) or []:
        t.finish()
    if getattr(acc, "trackers", None):
        acc.trackers = []
