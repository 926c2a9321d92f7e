"""Rich tables for ``finetune report``."""

from __future__ import annotations

from rich.table import Table

from finetune_cli.pipelines.report import fmt_ci, fmt_mean_std, fmt_p


def render_report(ui, rep) -> None:
    t = Table(title=f"mean ± std over seeds · {rep.task}")
    for c in ("recipe", "objective", "seeds"):
        t.add_column(c)
    for m in rep.metrics:
        t.add_column(m, justify="right")
    for g in rep.groups:
        t.add_row(g.name, g.objective, ",".join(map(str, g.seeds)), *(fmt_mean_std(g.stats[m]) for m in rep.metrics))
    ui.print(t)
    if not rep.comparisons:
        return
    c_t = Table(title="paired comparison over shared seeds (A − B, 95% CI, paired t-test, Wilcoxon)")
    for c in ("A − B", "metric", "n", "difference", "95% CI", "p (t)", "p (Wilcoxon)"):
        c_t.add_column(c, justify="right" if c not in ("A − B", "metric", "95% CI") else "left",
                       no_wrap=c in ("95% CI", "difference"))
    for c in rep.comparisons:
        c_t.add_row(f"{c.a} − {c.b}", c.metric, str(c.n), "–" if c.diff is None else f"{c.diff:+.4f}",
                    fmt_ci(c.ci95), fmt_p(c.t_pvalue), fmt_p(c.wilcoxon_pvalue))
    ui.print(c_t)
    notes = {}
    for c in rep.comparisons:
        if c.note:
            notes.setdefault(f"{c.a} − {c.b}: {c.note}", []).append(c.metric)
    for text, metrics in notes.items():
        ui.log(f"note: {text} ({', '.join(metrics)})")
