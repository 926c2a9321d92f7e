"""Rich tables for ``finetune sweep``."""

from __future__ import annotations

import math
from typing import Any

from rich.table import Table

from finetune_cli.cli.report_render import fmt_ci, fmt_p
from finetune_cli.engine.search import TrialRow


def render_sweep(ui, res) -> None:
    seeds = ",".join(map(str, res.seeds))
    t = Table(title=f"sweep {res.sweep_dir} · {res.metric} ({res.direction}), mean ± std over seeds {seeds}")
    t.add_column("trial", justify="right")
    for p in res.params:
        t.add_column(p, justify="right")
    t.add_column(res.metric, justify="right", no_wrap=True)
    t.add_column("state")
    rows = list(res.trials) + ([res.baseline] if res.baseline else [])
    for r in rows:
        name = "recipe" if r.number < 0 else str(r.number) + (" *" if res.best and r.number == res.best.number else "")
        state = r.state.lower() + (f" ({r.note})" if r.note else "")
        t.add_row(name, *(fmt_value(r.params.get(p, "")) for p in res.params), fmt_mean(r), state)
    ui.print(t)
    c = res.comparison
    if c:
        ct = Table(title=f"best trial {res.best.number} − the recipe's own values ({c['metric']}, paired over "
                         f"seeds {','.join(map(str, c['seeds']))})")
        for col in ("best", "recipe", "diff", "95% CI", "p (t)", "p (W)"):
            ct.add_column(col, justify="left" if col == "95% CI" else "right", no_wrap=True)

        def f(v):
            return "–" if v is None else f"{v:.4f}"

        ct.add_row(f(c["mean_a"]), f(c["mean_b"]), "–" if c["diff"] is None else f"{c['diff']:+.4f}",
                   fmt_ci(c["ci95"]), fmt_p(c["t_pvalue"]), fmt_p(c["wilcoxon_pvalue"]))
        ui.print(ct)
        if c.get("note"):
            ui.log(f"note: {c['note']}")
    if res.best_recipe:
        ui.log(f"best recipe: {res.best_recipe} (finetune train -r {res.best_recipe})")


def fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if (v != 0 and (abs(v) < 1e-2 or abs(v) >= 1e4)) else f"{v:.4g}"
    return str(v)


def fmt_mean(row: TrialRow) -> str:
    if row.mean is None or (isinstance(row.mean, float) and math.isnan(row.mean)):
        return "–"
    return f"{row.mean:.4f}" + (f" ± {row.std:.4f}" if row.std is not None else "")
