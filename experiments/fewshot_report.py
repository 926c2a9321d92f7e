"""The few-shot study's results page: per task and N, the averages over task groups, and the cost.

``results`` is ``{task: {N: {row: {seed: record}}}}`` as ``fewshot_study.run_task`` returns it; a
record holds ``test`` (metrics on the test half), ``select`` (accuracy on the selection half),
``wall_s`` and ``cpu_s`` (training and evaluation of that seed), and ``steps`` for recipes.
"""

from __future__ import annotations

import math
import os
import platform
from pathlib import Path

import fewshot_anchors as fa
import fewshot_study as fs

ANCHOR_ROWS = ("probe", "setfit")
GROUPS = (("sentiment", "sentiment tasks"), ("pair", "pair tasks"), ("multiclass", "multi-class tasks"),
          ("acceptability", "CoLA"), (None, "all tasks"))


def mean(xs) -> float:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return sum(xs) / len(xs) if xs else float("nan")


def ms(values) -> str:
    from finetune_cli.cli.report_render import fmt_mean_std
    from finetune_cli.metrics.stats import mean_std

    vals = [v for v in values if v is not None]
    if not vals:
        return "–"
    m, sd = mean_std(vals)
    return fmt_mean_std({"mean": m, "std": sd})


def acc(recs: dict, seed) -> float:
    return recs[seed]["test"]["accuracy"]


def group_tasks(results: dict, group) -> list[str]:
    return [t for t in results if group is None or fs.TASKS[t].group == group]


def group_mean(results, tasks, n, row, key="test") -> float:
    """Mean over ``tasks`` of the row's mean over seeds (test accuracy or selection accuracy)."""
    vals = []
    for t in tasks:
        recs = results[t].get(n, {}).get(row)
        if recs:
            vals.append(mean(r["test"]["accuracy"] if key == "test" else r["select"] for r in recs.values()))
    return mean(vals) if len(vals) == len(tasks) else float("nan")


def group_diff(results, tasks, n, row, anchor) -> float:
    """Mean over ``tasks`` of the paired (same seeds) test-accuracy difference row − anchor."""
    vals = []
    for t in tasks:
        by = results[t].get(n, {})
        if row in by and anchor in by:
            d = fa.paired({k: acc(by[row], k) for k in by[row]}, {k: acc(by[anchor], k) for k in by[anchor]})["diff"]
            vals.append(d)
    return mean(vals) if len(vals) == len(tasks) else float("nan")


def pts(x: float, sign: bool = True) -> str:
    return "–" if math.isnan(x) else (f"{100 * x:+.1f}" if sign else f"{100 * x:.1f}")


def summary(results, shots, rows, times: bool = True) -> list[str]:
    """Per N: each row's averages over the task groups, and its paired differences with the anchors."""
    L = ["## Averages over tasks", "",
         "Test-half accuracy in points (mean over the group's tasks of the mean over seeds); `Δ setfit`, `Δ probe`: "
         "the paired difference (same seeds) averaged over the group's tasks; `select`: selection-half accuracy "
         "averaged over all tasks, the number the recipes are chosen by" + ("; wall: seconds a run, mean over tasks."
                                                                            if times else ".")
         + " At each N the groups hold the tasks that have cells at that N (the study is run in parts).", ""]
    for n in shots:
        at_n = {t: by for t, by in results.items() if by.get(n)}
        groups = [(g, name, group_tasks(at_n, g)) for g, name in GROUPS]
        groups = [(g, name, ts) for g, name, ts in groups if ts]
        if not groups:
            continue
        head = [f"{name} acc" for _, name, _ in groups] + [f"{name} Δ setfit" for _, name, _ in groups]
        L += [f"### N = {n} per class", "", "Tasks: " + "; ".join(f"{name} {len(ts)}" for _, name, ts in groups)
              + ".", "", "| row | " + " | ".join(head) + " | all Δ probe | select |"
              + (" wall s |" if times else ""), "|---|" + "---:|" * (len(head) + 2 + times)]
        alltasks = list(at_n)
        for row in [r for r in rows if any(r in by[n] for by in at_n.values())]:
            cells = [pts(group_mean(results, ts, n, row), False) for _, _, ts in groups]
            cells += [pts(group_diff(results, ts, n, row, "setfit")) if row != "setfit" else "·" for _, _, ts in groups]
            wall = mean(mean(r["wall_s"] for r in results[t][n][row].values()) for t in alltasks
                        if row in results[t].get(n, {}))
            vs_probe = pts(group_diff(results, alltasks, n, row, "probe")) if row != "probe" else "·"
            wall_s = "–" if math.isnan(wall) else f"{wall:.0f}"
            L.append(f"| {row} | " + " | ".join(cells) + f" | {vs_probe} | "
                     f"{pts(group_mean(results, alltasks, n, row, 'select'), False)} |" + (f" {wall_s} |" if times else ""))
        L.append("")
    return L


def task_section(task: str, by_n: dict, files_rows: dict, times: bool = True) -> list[str]:
    from finetune_cli.cli.report_render import fmt_ci, fmt_p

    t = fs.TASKS[task]
    L = [f"### {task}", "", f"`{t.folder}`, {t.group}; {files_rows.get('train', '?')} training rows to draw from, "
                             f"selection half {files_rows.get('select', '?')}, test half {files_rows.get('test', '?')}.", ""]
    for n, by_row in by_n.items():
        if not by_row:
            continue
        L += [f"N = {n} per class:", "", "| row | seeds | test accuracy | ECE | select acc | steps |"
              + (" wall s/run | CPU s/run |" if times else ""), "|---|---:|---:|---:|---:|---:|" + "---:|" * (2 * times)]
        for row, recs in by_row.items():
            steps = sorted({r.get("steps") for r in recs.values() if r.get("steps")})
            L.append(f"| {row} | {len(recs)} | {ms(r['test']['accuracy'] for r in recs.values())} | "
                     f"{ms(r['test'].get('ece') for r in recs.values())} | {ms(r['select'] for r in recs.values())} | "
                     f"{'/'.join(map(str, steps)) or '–'} |" + (f" {mean(r['wall_s'] for r in recs.values()):.0f} | "
                                                               f"{mean(r['cpu_s'] for r in recs.values()):.0f} |"
                                                               if times else ""))
        comps = [(a, b) for b in ANCHOR_ROWS if b in by_row for a in by_row if a != b and not (
            a == "probe" and b == "setfit")]
        if comps:
            L += ["", "| comparison | n | difference | 95% CI | p (t) | p (Wilcoxon) | W/T/L |",
                  "|---|---:|---:|---|---:|---:|---|"]
            for a, b in comps:
                c = fa.paired({k: acc(by_row[a], k) for k in by_row[a]}, {k: acc(by_row[b], k) for k in by_row[b]})
                diff = "–" if c["diff"] is None else f"{c['diff']:+.4f}"
                L.append(f"| {a} − {b} | {c['n']} | {diff} | {fmt_ci(c['ci95'])} | {fmt_p(c['t_pvalue'])} | "
                         f"{fmt_p(c['wilcoxon_pvalue'])} | {c['wins']}/{c['ties']}/{c['losses']} |")
        L.append("")
    return L


def protocol(args, cmd, hyper, anchors, notes, smoke) -> list[str]:
    L = []
    if smoke:
        L += ["> **REDUCED RUN, not the full study.** Written by a run with fewer tasks, sizes, seeds or rows "
              "than the defaults; it shows what that command measured.", ""]
    made = (["Written from the ledger (`" + fs.rel(args.ledger) + "`, every finished cell of every run of the study) by:",
             "", "```", cmd, "```", "", "The cells are made by the same command without `--report-only` (it skips "
             "the cells already in the ledger, so it can be run in parts).", ""] if args.report_only
            else ["Made by:", "", "```", cmd, "```", ""])
    L += ["# Few-shot study: the few-shot recipes against a linear probe and SetFit 1.2", "", *made,
          f"- Model `{args.model}` (all-MiniLM-L6-v2 when `embedded`); max length "
          f"{args.max_length or '64 (pairs 128)'}. Seeds {args.seeds}: each seed draws N examples a class from the "
          "task's training rows, the same draw for every row.",
          f"- Each task's dev part is split once (stratified, seed {fs.SPLIT_SEED}) into a selection half (the best "
          "checkpoint of each run; the recipes' settings) and a test half (only the final evaluation, below).",
          "- Pairs: the recipes encode `(a, b)` jointly (`[CLS] a [SEP] b [SEP]`, segment ids 0/1); the probe and "
          "SetFit read the one text `a [SEP] b` (same tokens, segment ids 0).", "- Rows:", ""]
    for label, h in hyper.items():
        params = ", ".join(f"{k}={v}" for k, v in h.items() if k not in ("recipe", "objective", "schedule"))
        L.append(f"  - `{label}`: recipe `{h['recipe']}`, objective `{h['objective']}` ({params or 'defaults'}); "
                 f"{h['schedule']}")
    if "probe" in anchors:
        L.append("  - `probe`: scikit-learn `LogisticRegression()` on the frozen body's mean-pooled embeddings.")
    if "setfit" in anchors:
        st = fa.SETFIT_SETTINGS
        L.append(f"  - `setfit`: SetFit 1.2, same body, batch {st['batch_size']}, {st['epochs']} epoch, "
                 f"`num_iterations={st['num_iterations']}`, logistic-regression head.")
    if notes:
        L += ["", "Skipped:", ""] + [f"- {n}" for n in notes]
    return L + [""]


def paired_seeds(results: dict) -> dict:
    """Each task and N keeps the seeds that every row of it has: a row's mean and the paired differences
    are then over the same draws (a study stopped part-way leaves a seed with some rows only)."""
    out = {}
    for task, by_n in results.items():
        out[task] = {}
        for n, by_row in by_n.items():
            common = set.intersection(*(set(recs) for recs in by_row.values())) if by_row else set()
            out[task][n] = {row: {k: recs[k] for k in sorted(common)} for row, recs in by_row.items()} if common else {}
    return out


def coverage(results, shots) -> list[str]:
    """What the page holds: per N, the tasks and their seeds (after :func:`paired_seeds`, those of every row)."""
    L = ["Cells on this page (task: the seeds that every row of it has; a seed some rows lack is left out):", ""]
    for n in shots:
        per = []
        for task, by_n in results.items():
            seeds = sorted({s for recs in by_n.get(n, {}).values() for s in recs})
            if seeds:
                per.append(f"{task} {','.join(map(str, seeds))}")
        L.append(f"- N = {n}: " + ("; ".join(per) if per else "none"))
    return L + [""]


def write_results(path: Path, args, cmd, results, hyper, notes, anchors, torch) -> None:
    shots = [int(s) for s in args.shots.split(",")]
    results = paired_seeds(results)
    rows = list(dict.fromkeys(r for t in results.values() for by in t.values() for r in by))
    smoke = any(getattr(args, k) != v for k, v in fs.FULL.items()) or args.max_steps or args.overrides
    times = not args.no_times
    L = (protocol(args, cmd, hyper, anchors, notes, smoke) + coverage(results, shots)
         + summary(results, shots, rows, times) + ["## Per task", ""])
    for task, by_n in results.items():
        d = Path(args.out) / task / "data"
        sizes = {k: sum(1 for _ in open(d / f"{k}.jsonl")) for k in ("train", "select", "test") if (d / f"{k}.jsonl").is_file()}
        L += task_section(task, by_n, sizes, times)
    if times:
        recs = [r for t in results.values() for by in t.values() for seeds in by.values() for r in seeds.values()]
        wall, cpu = sum(r["wall_s"] for r in recs), sum(r["cpu_s"] for r in recs)
        L += ["## Cost", "", f"- Every run summed: {cpu / 60:.1f} CPU-minutes, {wall / 60:.1f} minutes wall-clock "
                             "(each run's time is stored when it is made and kept when the study resumes).",
              f"- Machine: {platform.machine()}, {os.cpu_count()} logical CPUs, torch {torch.__version__} "
              f"({torch.get_num_threads()} threads), device `{args.device}`.", ""]
    else:
        L += ["Times are left off this page (`--no-times`): its cells were made on a shared machine, where a run's "
              "time measures the load as much as the run. The cost against SetFit is measured on an idle machine "
              "by `bench/fewshot_cost.py`.", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(L) + "\n", encoding="utf-8")
