"""Few-shot SST-2 study: CE vs SCL vs Core-tuning vs R4F vs Focal on the embedded MiniLM.

    python experiments/fewshot_sst2.py                      # the whole study (writes docs/RESULTS.md)
    python experiments/fewshot_sst2.py --objectives ce --shots 20 --seeds 1,2 --results /tmp/smoke.md

Protocol (after Gunel et al., "Supervised Contrastive Learning for Pre-trained Language Model
Fine-tuning", ICLR 2021, arXiv 2011.01403, few-shot section):

* training: N examples per class drawn from SST-2 train (``data.few_shot=N``); the seed draws the
  sample and everything else of the run (``finetune train --seeds``);
* SST-2 dev (872 sentences) is split once, stratified by label with a fixed seed, into two halves:
  the *selection* half picks the best checkpoint (evaluated once per epoch), the *test* half is
  touched only by the final ``finetune eval`` of that checkpoint;
* every objective takes its hyper-parameters from its packaged recipe (``recipes/<name>.yaml``),
  and the model, data, schedule and pooling are the same for all;
* reported: accuracy and ECE (15 bins) on the test half, mean ± std over seeds, and the paired
  comparison of every objective against CE over the same seeds (``finetune report``).

Objectives that are not registered in this build are skipped with a note. A label can name a
variant: ``ce_ls:ce:label_smoothing=0.1`` is CE with label smoothing reported as ``ce_ls``.
Rerunning the command reuses finished runs and evaluations, so an interrupted study resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

FULL = {"objectives": "ce,scl,core_tuning,r4f,focal", "shots": "20,100", "seeds": "1,2,3,4,5"}
SPLIT_SEED = 2021


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--objectives", default=FULL["objectives"],
                   help="comma-separated: NAME, or LABEL:OBJECTIVE[:key=value...] (default: %(default)s)")
    p.add_argument("--shots", default=FULL["shots"], help="examples per class (default: %(default)s)")
    p.add_argument("--seeds", default=FULL["seeds"], help="seeds, e.g. 1,2,3 or 1-5 (default: %(default)s)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--epochs", type=float, default=None, help="epochs per run (default: 10)")
    g.add_argument("--max-steps", type=int, default=None, help="optimizer steps per run instead of epochs")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=5e-5, help="encoder learning rate")
    p.add_argument("--head-lr", type=float, default=1e-3, help="learning rate of the new heads")
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--model", default="embedded")
    p.add_argument("--data-dir", default=os.environ.get("FINETUNE_SHARED_DATA", str(REPO.parent / "shared" / "data")),
                   help="folder holding SST-2/train.tsv and SST-2/dev.tsv (default: %(default)s)")
    p.add_argument("--out", default=str(REPO / "runs" / "fewshot_sst2"), help="runs and the dev halves go here")
    p.add_argument("--results", default=str(REPO / "docs" / "RESULTS.md"), help="Markdown results file")
    p.add_argument("--device", default="auto")
    p.add_argument("--no-figures", action="store_true", help="skip reliability / t-SNE PNGs of each run")
    p.add_argument("--keep", choices=("all", "best", "none"), default="best",
                   help="model folders kept after a run is evaluated: all (checkpoints too, ~430 MB a run), "
                        "best (~90 MB, default) or none (eval.json, metrics and figures only)")
    p.add_argument("--quiet", action="store_true", help="no per-run training output")
    return p.parse_args(argv)


def split_dev(dev: Path, out: Path) -> tuple[Path, Path]:
    """Stratified 50/50 split of SST-2 dev with a fixed seed: (selection half, test half).

    Rows of each label are shuffled with ``SPLIT_SEED``; the first floor(n/2) go to selection.
    Files are rewritten only when their content would change, so reruns see the same files.
    """
    lines = [ln.rstrip("\n") for ln in dev.read_text(encoding="utf-8").splitlines() if ln.strip()]
    header, rows = lines[0], lines[1:]
    labels = [r.rsplit("\t", 1)[1].strip() for r in rows]
    rng = np.random.default_rng(SPLIT_SEED)
    select, test = [], []
    for lab in sorted(set(labels)):
        idx = [i for i, x in enumerate(labels) if x == lab]
        perm = rng.permutation(len(idx))
        half = len(idx) // 2
        select += [idx[j] for j in perm[:half]]
        test += [idx[j] for j in perm[half:]]
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, idx in (("dev_select.tsv", sorted(select)), ("dev_test.tsv", sorted(test))):
        text = "\n".join([header] + [rows[i] for i in idx]) + "\n"
        f = out / name
        if not f.is_file() or f.read_text(encoding="utf-8") != text:
            f.write_text(text, encoding="utf-8")
        paths.append(f)
    return paths[0], paths[1]


def parse_objectives(spec: str) -> list[tuple[str, str, list[str]]]:
    """``ce,ce_ls:ce:label_smoothing=0.1`` -> [(label, objective, [objective.key=value, ...])]."""
    out = []
    for item in [s.strip() for s in spec.split(",") if s.strip()]:
        parts = item.split(":")
        label, name = (parts[0], parts[0]) if len(parts) == 1 else (parts[0], parts[1])
        # key=value is an objective parameter, unless it names another recipe section
        # (``mean:ce:model.head=pooled``: the same objective with the pooled head)
        out.append((label, name, [kv if kv.split("=", 1)[0].startswith(("model.", "data.", "train."))
                                  else f"objective.{kv}" for kv in parts[2:]]))
    return out


def base_recipe_name(objective: str) -> str:
    from finetune_cli.recipe import PACKAGED_RECIPES

    return objective if (PACKAGED_RECIPES / f"{objective}.yaml").is_file() else "ce"


def study_overrides(args, objective: str, extra: list[str], shots: int, train: Path, select: Path,
                    label: str) -> list[str]:
    sched = [f"train.max_steps={args.max_steps}"] if args.max_steps else [f"train.epochs={args.epochs or 10}",
                                                                           "~train.max_steps"]
    return [
        f"model.name={args.model}", "model.pooling=mean", f"model.max_length={args.max_length}",
        "~data.dataset", "~data.max_train_samples", "~data.max_eval_samples", "~data.seed", "~data.label_names",
        f"data.train={train}", f"data.eval={select}", "data.columns.text=sentence", "data.columns.label=label",
        f"data.few_shot={shots}",
        f"objective.name={objective}", *extra,
        *sched, f"train.batch_size={args.batch_size}", f"train.lr={args.lr}", f"train.head_lr={args.head_lr}",
        "~train.eval_every", "~train.save_every", "~train.early_stopping_patience", "train.metric=accuracy",
        "~train.greater_is_better", "train.keep_checkpoints=1",
        f"output.dir={Path(args.out) / f'n{shots}'}", f"output.name={label}",
    ]


def prune(run_dir: Path, keep: str) -> None:
    """Drop model folders of an evaluated run (a finished run is never retrained: summary.json stays)."""
    import shutil

    if keep == "all":
        return
    doomed = [*run_dir.glob("checkpoint-*"), run_dir / "final"] + ([run_dir / "best"] if keep == "none" else [])
    for d in doomed:
        if d.is_dir():
            shutil.rmtree(d)


def rel(p) -> str:
    """A path relative to the repository when it lies inside it (RESULTS.md stays portable)."""
    try:
        return str(Path(p).resolve().relative_to(REPO))
    except ValueError:
        return str(p)


def cpu_seconds() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def main(argv=None) -> int:
    args = parse_args(argv)
    t_wall, t_cpu = time.perf_counter(), cpu_seconds()
    import torch

    from finetune_cli.cli.report_render import fmt_ci, fmt_mean_std, fmt_p
    from finetune_cli.objectives import registry
    from finetune_cli.pipelines.evaluate import eval_recipe, run_eval
    from finetune_cli.pipelines.multiseed import parse_seeds, run_seeds
    from finetune_cli.pipelines.recipes import load_recipe
    from finetune_cli.pipelines.report import build_report
    from finetune_cli.rundir import EVAL as EVAL_FILE
    from finetune_cli.ui import UI

    ui = UI(quiet=args.quiet)
    say = UI().log
    data = Path(args.data_dir)
    train_file, dev_file = data / "SST-2" / "train.tsv", data / "SST-2" / "dev.tsv"
    if not (train_file.is_file() and dev_file.is_file()):
        print(f"error: SST-2 not found under {data} (pass --data-dir)", file=sys.stderr)
        return 2
    select, test = split_dev(dev_file, Path(args.out) / "data")
    shots = [int(s) for s in args.shots.split(",")]
    seeds = parse_seeds(args.seeds)
    known = set(registry.names())
    objectives, notes = [], []
    for label, name, extra in parse_objectives(args.objectives):
        if name not in known:
            notes.append(f"`{label}` skipped: objective `{name}` is not registered in this build "
                         f"(registered: {', '.join(sorted(known))})")
            say(f"note: {notes[-1]}")
        else:
            objectives.append((label, name, extra))
    if not objectives:
        print("error: none of the objectives is registered", file=sys.stderr)
        return 2

    hyper: dict[str, dict] = {}
    sections = {}
    per_run = []
    for n in shots:
        dirs = []
        for label, name, extra in objectives:
            recipe = load_recipe(base_recipe_name(name),
                                 study_overrides(args, name, extra, n, train_file, select, label))
            hyper[label] = {"recipe": base_recipe_name(name), "objective": name, **dict(recipe.objective.params)}
            say(f"== N={n} per class · {label} · seeds {args.seeds} ==")
            cost_file = Path(args.out) / f"n{n}" / label / "cost.json"
            cost = json.loads(cost_file.read_text()) if cost_file.is_file() else {}
            for seed in seeds:
                t0, c0 = time.perf_counter(), cpu_seconds()
                (o,) = run_seeds(recipe, [seed], ui, device=args.device)
                ev_file = o.run_dir / EVAL_FILE
                done = ev_file.is_file() and json.loads(ev_file.read_text()).get("data") == str(test)
                if not done:
                    r = eval_recipe(str(o.run_dir), None, [f"data.eval={test}"])
                    run_eval(str(o.run_dir), r, ui, device=args.device, figures=not args.no_figures)
                prune(o.run_dir, args.keep)
                if not (o.already_complete and done and str(seed) in cost):
                    # Time of training + evaluation of this seed; a reused run keeps the time measured
                    # when it was made, so the study's total does not depend on interruptions.
                    cost[str(seed)] = {"wall_s": time.perf_counter() - t0, "cpu_s": cpu_seconds() - c0}
                    cost_file.write_text(json.dumps(cost, indent=2))
                ev = json.loads(ev_file.read_text())
                say(f"   {rel(o.run_dir)}: test accuracy {ev['metrics']['accuracy']:.4f}  "
                    f"ECE {ev['calibration']['ece']:.4f}" + ("  (reused)" if o.already_complete and done else ""))
            per_run.append({"shots": n, "objective": label, "wall_s": sum(cost[str(k)]["wall_s"] for k in seeds),
                            "cpu_s": sum(cost[str(k)]["cpu_s"] for k in seeds)})
            dirs.append(str(Path(args.out) / f"n{n}" / label))
        labels = [lab for lab, _, _ in objectives]
        compare = [f"{lab},ce" for lab in labels if lab != "ce"] if "ce" in labels else []
        rep = build_report(dirs, compare, plot=Path(args.out) / f"n{n}" / "report.png")
        sections[n] = rep

    # The study's cost: the measured time of every run (kept from earlier invocations when reused).
    wall, cpu = sum(r["wall_s"] for r in per_run), sum(r["cpu_s"] for r in per_run)
    say(f"this invocation: wall {(time.perf_counter() - t_wall) / 60:.1f} min, CPU {(cpu_seconds() - t_cpu) / 60:.1f} min")
    cmd = "python experiments/fewshot_sst2.py" + "".join(f" {shlex.quote(a)}" for a in (argv if argv is not None
                                                                                          else sys.argv[1:]))
    smoke = any(getattr(args, k) != v for k, v in FULL.items()) or args.epochs or args.max_steps
    write_results(Path(args.results), args, cmd, sections, hyper, notes, per_run, wall, cpu, smoke, select, test,
                  torch, fmt_mean_std, fmt_ci, fmt_p)
    say(f"results: {rel(args.results)}  (wall {wall / 60:.1f} min, CPU {cpu / 60:.1f} min)")
    return 0


def write_results(path: Path, args, cmd, sections, hyper, notes, per_run, wall, cpu, smoke, select, test, torch,
                  fmt_mean_std, fmt_ci, fmt_p) -> None:
    sched = f"{args.max_steps} optimizer steps" if args.max_steps else f"{args.epochs or 10:g} epochs"
    L = []
    if smoke:
        L += ["> **SMOKE RUN, not the study.** This file was written by a reduced run of the study script "
              "(fewer objectives, shots, seeds or a shorter schedule than the defaults); it shows that the "
              "pipeline works end to end, not how the objectives compare. Rerun the command without options "
              "for the study.", ""]
    L += ["# Few-shot SST-2: CE vs SCL vs Core-tuning vs R4F vs Focal", "",
          "Made by:", "", "```", f"{cmd}", "```", "",
          f"- Model: `{args.model}` (all-MiniLM-L6-v2 when `embedded`), mean pooling, max length {args.max_length}.",
          f"- Training data: N examples per class from SST-2 train (67,349 sentences), drawn by the run's seed; "
          f"N = {', '.join(f'{n}' for n in sections)}.",
          f"- Selection / test: SST-2 dev (872) split once, stratified, seed {SPLIT_SEED}: "
          f"{sum(1 for _ in open(select)) - 1} sentences pick the best checkpoint (evaluated every epoch), "
          f"{sum(1 for _ in open(test)) - 1} are used only for the final evaluation below "
          f"(as in Gunel et al. 2021, arXiv 2011.01403).",
          f"- Schedule (same for all): {sched}, batch {args.batch_size}, lr {args.lr:g} (heads {args.head_lr:g}), "
          f"AdamW, linear warm-up 6% and decay; seeds {args.seeds}.",
          "- Objective hyper-parameters: from each objective's packaged recipe:", ""]
    for label, h in hyper.items():
        params = ", ".join(f"{k}={v}" for k, v in h.items() if k not in ("recipe", "objective")) or "defaults"
        L.append(f"  - `{label}`: objective `{h['objective']}` (recipe `{h['recipe']}`): {params}")
    if notes:
        L += ["", "Skipped:", ""] + [f"- {n}" for n in notes]
    L += ["", "Metrics on the test half: accuracy and ECE (15 equal-width bins, Guo et al. 2017), "
              "mean ± sample std over seeds.", ""]
    for n, rep in sections.items():
        L += [f"## N = {n} per class", "", "| objective | seeds | accuracy | ECE | macro-F1 |", "|---|---:|---:|---:|---:|"]
        for g in rep.groups:
            L.append(f"| {g.name} | {len(g.seeds)} | {fmt_mean_std(g.stats['accuracy'])} | "
                     f"{fmt_mean_std(g.stats['ece'])} | {fmt_mean_std(g.stats['f1_macro'])} |")
        comps = [c for c in rep.comparisons if c.metric in ("accuracy", "ece")]
        if comps:
            L += ["", "Paired over seeds (difference = objective − CE; 95% CI from the t distribution; two-sided "
                      "paired t-test; exact Wilcoxon signed-rank with ≥ 5 pairs):", "",
                  "| comparison | metric | n | difference | 95% CI | p (paired t) | p (Wilcoxon) |",
                  "|---|---|---:|---:|---|---:|---:|"]
            for c in comps:
                diff = "–" if c.diff is None else f"{c.diff:+.4f}"
                L.append(f"| {c.a} − {c.b} | {c.metric} | {c.n} | {diff} | {fmt_ci(c.ci95)} | "
                         f"{fmt_p(c.t_pvalue)} | {fmt_p(c.wilcoxon_pvalue)} |")
        else:
            L += ["", "No paired comparison (it needs CE and at least one other objective)."]
        L += ["", f"Box plot: `{rel(rep.plot)}`; per-run reliability diagrams and t-SNE pictures: "
                  f"`<run>/figures/`.", ""]
    L += ["## Cost", "",
          f"- Whole study: **{cpu / 60:.1f} CPU-minutes** (user + system; training and evaluation of every run, "
          f"summed), {wall / 60:.1f} minutes wall-clock.",
          f"- Machine: {platform.machine()}, {os.cpu_count()} logical CPUs, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), device `{args.device}`"
          + (f", CUDA {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() and args.device != "cpu" else "")
          + ".", "", "| N | objective | wall (s) | CPU (s) |", "|---:|---|---:|---:|"]
    for r in per_run:
        L.append(f"| {r['shots']} | {r['objective']} | {r['wall_s']:.0f} | {r['cpu_s']:.0f} |")
    L.append("")
    L.append("Each run's time is measured when it is made and stored in `<runs>/n<N>/<objective>/cost.json`; "
             "a resumed study reuses finished runs and their recorded times.")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(L) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
