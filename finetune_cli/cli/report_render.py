"""Rich tables for ``finetune report``."""

from __future__ import annotations

from typing import Any, Optional

from rich.table import Table

from finetune_cli.pipelines.report import Report


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


def fmt_mean_std(s: dict[str, Any], digits: int = 4) -> str:
    if s["std"] is None:
        return f"{s['mean']:.{digits}f}"
    return f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f}"


def fmt_p(p: Optional[float]) -> str:
    if p is None:
        return "–"
    return f"{p:.2e}" if p < 1e-3 else f"{p:.4f}"


def fmt_ci(ci: Optional[list[float]]) -> str:
    return f"[{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci else "–"


def to_markdown(rep: Report) -> str:
    lines = [f"Task: {rep.task}", "",
             "| recipe | objective | seeds | " + " | ".join(rep.metrics) + " |",
             "|---|---|---|" + "---:|" * len(rep.metrics)]
    for g in rep.groups:
        lines.append(f"| {g.name} | {g.objective} | {len(g.seeds)} | "
                     + " | ".join(fmt_mean_std(g.stats[m]) for m in rep.metrics) + " |")
    if rep.comparisons:
        lines += ["", "Paired comparison over shared seeds (difference = A − B; 95% CI from the t distribution; "
                      "two-sided paired t-test; Wilcoxon signed-rank with ≥ 5 pairs):", "",
                  "| A − B | metric | n | mean A | mean B | difference | 95% CI | p (paired t) | p (Wilcoxon) |",
                  "|---|---|---:|---:|---:|---:|---|---:|---:|"]
        def f(v: Optional[float]) -> str:
            return "–" if v is None else f"{v:.4f}"

        for c in rep.comparisons:
            diff = "–" if c.diff is None else f"{c.diff:+.4f}"
            lines.append(f"| {c.a} − {c.b} | {c.metric} | {c.n} | {f(c.mean_a)} | {f(c.mean_b)} | {diff} | "
                         f"{fmt_ci(c.ci95)} | {fmt_p(c.t_pvalue)} | {fmt_p(c.wilcoxon_pvalue)} |")
    return "\n".join(lines) + "\n"
