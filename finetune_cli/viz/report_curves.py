"""``finetune report --curves FILE.png``: the training curves of several runs in one figure.

Runs are grouped as the report groups them (one recipe = one colour); each run's
``metrics.jsonl`` is a thin line and the recipe's mean over seeds a bold one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from finetune_cli.errors import DataError
from finetune_cli.rundir import RunDir


def report_curves(rep, path: Path) -> tuple[Path, dict[str, Any]]:
    """Draw the curves of the runs of ``rep`` (a ``Report``); returns the PNG and the data drawn."""
    from finetune_cli.viz._mpl import pyplot, save
    from finetune_cli.viz.curves import draw_multi_run, multi_run_series

    groups: dict[str, list] = {}
    for r in rep.runs:
        log = RunDir(r.path).metrics
        if not log.exists():
            raise DataError(f"--curves: run {r.path} has no {log.path.name}")
        groups.setdefault(r.group, []).append(log.read())
    data = multi_run_series(groups)
    pyplot()  # one-line error when matplotlib is missing
    return save(draw_multi_run(data, title=f"{len(rep.runs)} runs · {rep.task}"), Path(path)), data
