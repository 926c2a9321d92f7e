"""Few-shot SST-2 study: fine-tuning objectives vs a linear probe and SetFit on the embedded MiniLM.

    python experiments/fewshot_sst2.py                      # the whole study (writes runs/fewshot/results.md)
    python experiments/fewshot_sst2.py --objectives ce --shots 20 --seeds 1,2 --results /tmp/smoke.md
    python experiments/fewshot_sst2.py --recipes flat       # the pre-issue-15 protocol (10 epochs each)

Protocol (after Gunel et al., "Supervised Contrastive Learning for Pre-trained Language Model
Fine-tuning", ICLR 2021, arXiv 2011.01403, few-shot section):

* training: N examples per class drawn from SST-2 train (``data.few_shot=N``); the seed draws the
  sample and everything else of the run (``finetune train --seeds``);
* SST-2 dev (872 sentences) is split once, stratified by label with a fixed seed, into two halves:
  the *selection* half picks the best checkpoint (and, across studies, the recipes' settings), the
  *test* half is touched only by the final ``finetune eval`` of that checkpoint;
* ``--recipes fewshot`` (default): every row takes its recipe, schedule included, from
  ``recipes/fewshot/<label>.yaml`` (a budget in optimizer steps, evaluations tied to it);
  ``--recipes flat``: the objective's full-data recipe with the study's schedule (10 epochs, batch
  16, lr 5e-5, heads 1e-3), as before issue 15. ``--epochs/--max-steps/--lr/...`` override both;
* anchors on exactly the same draws (``experiments/fewshot_anchors.py``): a logistic-regression probe
  on the frozen embeddings and SetFit with the same body;
* reported: accuracy and ECE (15 bins) on the test half, mean ± std over seeds, the selection-half
  accuracy, paired comparisons against CE, the probe and SetFit, wall and CPU time per run, and every
  row on out-of-domain review sets (``sentiment-ood/*/dev.tsv``).

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
sys.path.insert(0, str(REPO / "experiments"))
import fewshot_anchors as fa  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

FULL = {"objectives": "ce,head,scl,core_tuning", "shots": "20,100", "seeds": "1,2,3,4,5", "recipes": "fewshot",
        "anchors": "probe,setfit"}
FLAT_OBJECTIVES = "ce,scl,core_tuning,r4f,focal"
STUDY_SCHEDULE = {"epochs": 10, "batch_size": 16, "lr": 5e-5, "head_lr": 1e-3}  # --recipes flat
SPLIT_SEED = 2021


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--objectives", default=None,
                   help="comma-separated: NAME, or LABEL:OBJECTIVE[:key=value...] (default: "
                        f"{FULL['objectives']} with --recipes fewshot, {FLAT_OBJECTIVES} with flat)")
    p.add_argument("--recipes", choices=("fewshot", "flat"), default=FULL["recipes"],
                   help="fewshot: recipes/fewshot/<label>.yaml with their own schedule; flat: <objective>.yaml "
                        "with the study's schedule (default: %(default)s)")
    p.add_argument("--anchors", default=FULL["anchors"], help="comma-separated from: probe, setfit; '' for none "
                                                              "(default: %(default)s)")
    p.add_argument("--ood", default="books,dvd,electronics,kitchen,airline",
                   help="sentiment-ood domains to test every row on; '' for none (default: %(default)s)")
    p.add_argument("--shots", default=FULL["shots"], help="examples per class (default: %(default)s)")
    p.add_argument("--seeds", default=FULL["seeds"], help="seeds, e.g. 1,2,3 or 1-5 (default: %(default)s)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--epochs", type=float, default=None, help="epochs per run (flat default: 10)")
    g.add_argument("--max-steps", type=int, default=None, help="optimizer steps per run instead of epochs")
    p.add_argument("--batch-size", type=int, default=None, help="flat default: 16; fewshot: the recipe's")
    p.add_argument("--lr", type=float, default=None, help="encoder learning rate (flat default: 5e-5)")
    p.add_argument("--head-lr", type=float, default=None, help="learning rate of the new heads (flat: 1e-3)")
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--model", default="embedded")
    p.add_argument("--data-dir", default=os.environ.get("FINETUNE_SHARED_DATA", str(REPO.parent / "shared" / "data")),
                   help="folder holding SST-2/train.tsv and SST-2/dev.tsv (default: %(default)s)")
    p.add_argument("--out", default=str(REPO / "runs" / "fewshot_sst2"), help="runs and the dev halves go here")
    p.add_argument("--results", default=str(REPO / "runs" / "fewshot" / "results.md"), help="Markdown results file")
    p.add_argument("--device", default="auto")
    p.add_argument("--no-figures", action="store_true", help="skip reliability / t-SNE PNGs of each run")
    p.add_argument("--keep", choices=("all", "best", "none"), default="best",
                   help="model folders kept after a run is evaluated: all (checkpoints too, ~430 MB a run), "
                        "best (~90 MB, default) or none (eval.json, metrics and figures only)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="recipe override for every fine-tuning row (repeatable), e.g. --set train.min_evals=5")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (on a shared, oversubscribed CPU 1 is several times faster than 2)")
    p.add_argument("--report-only", action="store_true",
                   help="train nothing: write the results from the runs already finished (each row with the seeds "
                        "it has)")
    p.add_argument("--quiet", action="store_true", help="no per-run training output")
    args = p.parse_args(argv)
    if args.objectives is None:  # '' = anchors only
        args.objectives = FULL["objectives"] if args.recipes == "fewshot" else FLAT_OBJECTIVES
    return args


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


def base_recipe_name(objective: str, recipes: str = "flat", label: str | None = None) -> str:
    """The packaged recipe a row starts from: ``fewshot/<label>``, then ``fewshot/<objective>`` (with
    ``--recipes fewshot``), then ``<objective>``, then ``ce``."""
    from finetune_cli.recipe import PACKAGED_RECIPES

    names = []
    if recipes == "fewshot":
        names = ([f"fewshot/{label}"] if label else []) + [f"fewshot/{objective}"]
    for name in [*names, objective]:
        if (PACKAGED_RECIPES / f"{name}.yaml").is_file():
            return name
    return "ce"


def row_objective(label: str, name: str, recipes: str) -> str:
    """A bare label that names a few-shot recipe (``head``) trains that recipe's objective."""
    from finetune_cli.recipe import PACKAGED_RECIPES, read_yaml

    f = PACKAGED_RECIPES / "fewshot" / f"{label}.yaml"
    if recipes == "fewshot" and label == name and f.is_file():
        obj = read_yaml(f).get("objective") or {}
        return obj if isinstance(obj, str) else obj.get("name", "ce")
    return name


def study_overrides(args, objective: str, extra: list[str], shots: int, train: Path, select: Path,
                    label: str) -> list[str]:
    flat = args.recipes == "flat"
    dflt = STUDY_SCHEDULE if flat else {}
    if args.max_steps:
        sched = [f"train.max_steps={args.max_steps}", "~train.min_steps"]
    elif args.epochs or flat:
        sched = [f"train.epochs={args.epochs or dflt['epochs']}", "~train.max_steps", "~train.min_steps"]
    else:
        sched = []
    for key in ("batch_size", "lr", "head_lr"):
        v = getattr(args, key) if getattr(args, key) is not None else dflt.get(key)
        if v is not None:
            sched.append(f"train.{key}={v}")
    # The flat protocol evaluates once per epoch without early stopping; few-shot recipes keep theirs.
    cadence = ["~train.eval_every", "~train.save_every", "~train.early_stopping_patience"] if flat else []
    return [
        f"model.name={args.model}", "model.pooling=mean", f"model.max_length={args.max_length}",
        "~data.dataset", "~data.max_train_samples", "~data.max_eval_samples", "~data.seed", "~data.label_names",
        f"data.train={train}", f"data.eval={select}", "data.columns.text=sentence", "data.columns.label=label",
        f"data.few_shot={shots}",
        f"objective.name={objective}", *extra,
        *sched, *cadence, "train.metric=accuracy",
        "~train.greater_is_better", "train.keep_checkpoints=1",
        f"output.dir={Path(args.out) / f'n{shots}'}", f"output.name={label}", *args.overrides,
    ]


def schedule_text(t) -> str:
    steps = (f"{t.max_steps} steps" if t.max_steps else f"{t.epochs:g} epochs"
             + (f", at least {t.min_steps} steps" if t.min_steps else ""))
    return (f"{steps}, batch {t.batch_size}, lr {t.lr:g} (heads {t.head_lr or t.lr:g}), warm-up {t.warmup_ratio:g}"
            + (", encoder frozen" if t.freeze_encoder else "")
            + (f", ~{t.min_evals} evaluations" if t.min_evals else "")
            + (", head refitted (logistic regression) before each evaluation" if t.refit_head else ""))


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

    if args.threads:
        torch.set_num_threads(args.threads)

    from finetune_cli.cli.report_render import fmt_ci, fmt_mean_std, fmt_p
    from finetune_cli.objectives import registry
    from finetune_cli.pipelines.evaluate import eval_plan, run_eval
    from finetune_cli.pipelines.multiseed import parse_seeds, run_seeds
    from finetune_cli.pipelines.recipes import load_plan, load_recipe
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
        name = row_objective(label, name, args.recipes)
        if name not in known:
            notes.append(f"`{label}` skipped: objective `{name}` is not registered in this build "
                         f"(registered: {', '.join(sorted(known))})")
            say(f"note: {notes[-1]}")
        else:
            objectives.append((label, name, extra))
    anchors = [a for a in (x.strip() for x in args.anchors.split(",")) if a]
    bad = [a for a in anchors if a not in fa.ANCHORS]
    if bad:
        print(f"error: unknown anchor(s) {', '.join(bad)} (known: {', '.join(fa.ANCHORS)})", file=sys.stderr)
        return 2
    if "setfit" in anchors and (why := fa.setfit_available()):
        notes.append(f"`setfit` skipped: {why}")
        say(f"note: {notes[-1]}")
        anchors.remove("setfit")
    if not objectives and not anchors:
        print("error: none of the objectives is registered", file=sys.stderr)
        return 2
    ood = fa.ood_files(data, [d.strip() for d in args.ood.split(",") if d.strip()])

    hyper: dict[str, dict] = {}
    sections = {}
    rows: dict[int, dict[str, dict[int, dict]]] = {}  # N -> row label -> seed -> record
    per_run = []
    embedder = None

    def embed():
        nonlocal embedder
        embedder = embedder or fa.Embedder(args.model, args.max_length)
        return embedder

    for n in shots:
        dirs, rows[n] = [], {}
        base = None
        for label, name, extra in objectives:
            recipe_name = base_recipe_name(name, args.recipes, label)
            plan = load_plan(recipe_name, study_overrides(args, name, extra, n, train_file, select, label))
            recipe = plan.recipe
            base = base or recipe
            t = recipe.train
            head = "pooled_norm" if recipe.model.head == "pooled" and recipe.model.head_normalize else recipe.model.head
            hyper[label] = {"recipe": recipe_name, "head": head, "objective": name,
                            **dict(recipe.objective.params),
                            "schedule": schedule_text(t)}
            say(f"== N={n} per class · {label} · seeds {args.seeds} ==")
            cost_file = Path(args.out) / f"n{n}" / label / "cost.json"
            cost = json.loads(cost_file.read_text()) if cost_file.is_file() else {}
            rows[n][label] = {}
            done_seeds = [k for k in seeds if not args.report_only or (
                str(k) in cost and (Path(args.out) / f"n{n}" / label / f"seed-{k}" / EVAL_FILE).is_file())]
            if not done_seeds:
                notes.append(f"`{label}` at N={n}: no finished run (--report-only)")
                del rows[n][label]
                continue
            for seed in done_seeds:
                t0, c0 = time.perf_counter(), cpu_seconds()
                (o,) = run_seeds(plan, [seed], ui, device=args.device)
                ev_file = o.run_dir / EVAL_FILE
                done = ev_file.is_file() and json.loads(ev_file.read_text()).get("data") == str(test)
                if not done:
                    run_eval(str(o.run_dir), eval_plan(str(o.run_dir), None, [f"data.eval={test}"]), ui, device=args.device, figures=not args.no_figures)
                ood_res = fa.run_ood(o.run_dir, ood, recipe) if ood else {}
                prune(o.run_dir, args.keep)
                if not (o.already_complete and done and str(seed) in cost):
                    # Time of training + evaluation of this seed; a reused run keeps the time measured
                    # when it was made, so the study's total does not depend on interruptions.
                    cost[str(seed)] = {"wall_s": time.perf_counter() - t0, "cpu_s": cpu_seconds() - c0}
                    cost_file.write_text(json.dumps(cost, indent=2))
                ev = json.loads(ev_file.read_text())
                summ = json.loads((o.run_dir / "summary.json").read_text())
                rows[n][label][seed] = {"test": {**ev["metrics"], "ece": ev["calibration"]["ece"]},
                                        "select": summ.get("best_metric"), "ood": ood_res,
                                        "steps": summ.get("steps"), **cost[str(seed)]}
                say(f"   {rel(o.run_dir)}: test accuracy {ev['metrics']['accuracy']:.4f}  "
                    f"ECE {ev['calibration']['ece']:.4f}" + ("  (reused)" if o.already_complete and done else ""))
            per_run.append({"shots": n, "objective": label, "wall_s": sum(cost[str(k)]["wall_s"] for k in done_seeds),
                            "cpu_s": sum(cost[str(k)]["cpu_s"] for k in done_seeds)})
            # The seed folders of this invocation (an unfinished seed of another invocation stays out).
            dirs += [str(Path(args.out) / f"n{n}" / label / f"seed-{k}") for k in done_seeds]
        if base is None:  # anchors only: the data section of the CE recipe draws the same samples
            base = load_recipe(base_recipe_name("ce", args.recipes), study_overrides(args, "ce", [], n, train_file,
                                                                                     select, "ce"))
        for anchor in anchors:
            say(f"== N={n} per class · {anchor} (anchor) · seeds {args.seeds} ==")
            adir = Path(args.out) / f"n{n}" / anchor
            recs = fa.run_anchor(anchor, base, [k for k in seeds if not args.report_only or
                                                (adir / f"seed-{k}" / "result.json").is_file()],
                                 data, test, select, ood, adir, embed, cpu_seconds, say)
            if not recs:
                notes.append(f"`{anchor}` at N={n}: no finished run (--report-only)")
                continue
            rows[n][anchor] = {r["seed"]: {"test": r["metrics"]["test"], "select": r["metrics"]["select"]["accuracy"],
                                          "ood": {k: v for k, v in r["metrics"].items() if k not in ("test", "select")},
                                          "wall_s": r["wall_s"], "cpu_s": r["cpu_s"]} for r in recs}
            per_run.append({"shots": n, "objective": anchor, "wall_s": sum(r["wall_s"] for r in recs),
                            "cpu_s": sum(r["cpu_s"] for r in recs)})
        labels = [lab for lab, _, _ in objectives]
        compare = [f"{lab},ce" for lab in labels if lab != "ce"] if "ce" in labels else []
        sections[n] = build_report(dirs, compare, plot=Path(args.out) / f"n{n}" / "report.png") if dirs else None

    # The study's cost: the measured time of every run (kept from earlier invocations when reused).
    wall, cpu = sum(r["wall_s"] for r in per_run), sum(r["cpu_s"] for r in per_run)
    say(f"this invocation: wall {(time.perf_counter() - t_wall) / 60:.1f} min, CPU {(cpu_seconds() - t_cpu) / 60:.1f} min")
    cmd = "python experiments/fewshot_sst2.py" + "".join(f" {shlex.quote(a)}" for a in (argv if argv is not None
                                                                                          else sys.argv[1:]))
    smoke = any(getattr(args, k) != v for k, v in FULL.items()) or args.epochs or args.max_steps or args.overrides or any(
        getattr(args, k) is not None for k in ("batch_size", "lr", "head_lr"))
    write_results(Path(args.results), args, cmd, sections, hyper, notes, per_run, wall, cpu, smoke, select, test,
                  torch, fmt_mean_std, fmt_ci, fmt_p, rows=rows, anchors=anchors, ood=list(ood))
    say(f"results: {rel(args.results)}  (wall {wall / 60:.1f} min, CPU {cpu / 60:.1f} min)")
    return 0


def ms(values) -> dict:
    from finetune_cli.metrics.stats import mean_std

    vals = [v for v in values if v is not None]
    if not vals:
        return {"mean": float("nan"), "std": None}
    m, sd = mean_std(vals)
    return {"mean": m, "std": sd}


def write_results(path: Path, args, cmd, sections, hyper, notes, per_run, wall, cpu, smoke, select, test, torch,
                  fmt_mean_std, fmt_ci, fmt_p, rows=None, anchors=(), ood=()) -> None:
    rows = rows or {}
    L = []
    if smoke:
        L += ["> **SMOKE RUN, not the study.** This file was written by a reduced run of the study script "
              "(fewer objectives, shots, seeds or another schedule than the defaults); it shows what was "
              "measured with that command, not the full study. Rerun the command without options for the study.",
              ""]
    L += ["# Few-shot SST-2: fine-tuning objectives vs a linear probe and SetFit", "",
          "Made by:", "", "```", f"{cmd}", "```", "",
          f"- Model: `{args.model}` (all-MiniLM-L6-v2 when `embedded`), sentence embeddings (contrastive terms, probe) mean-pooled, max length {args.max_length}.",
          f"- Training data: N examples per class from SST-2 train (67,349 sentences), drawn by the run's seed; "
          f"N = {', '.join(f'{n}' for n in rows)}. Every row of one seed trains on the same sample.",
          f"- Selection / test: SST-2 dev (872) split once, stratified, seed {SPLIT_SEED}: "
          f"{sum(1 for _ in open(select)) - 1} sentences pick the best checkpoint, "
          f"{sum(1 for _ in open(test)) - 1} are used only for the final evaluation below "
          f"(as in Gunel et al. 2021, arXiv 2011.01403).",
          f"- Recipes: `--recipes {args.recipes}`; seeds {args.seeds}. Rows:", ""]
    for label, h in hyper.items():
        params = ", ".join(f"{k}={v}" for k, v in h.items() if k not in ("recipe", "head", "objective", "schedule")) or "defaults"
        head = {"native": "native head (the architecture's own: pooler on the first token → linear)",
                "pooled": "pooled head (mean pooling → linear)",
                "pooled_norm": "pooled head on the unit sphere (mean pooling → L2-normalise → linear)"}.get(h.get("head"), f"head {h.get('head')}")
        L.append(f"  - `{label}`: recipe `{h['recipe']}`, {head}, objective `{h['objective']}` ({params}); {h['schedule']}")
    if "probe" in anchors:
        L.append("  - `probe` (anchor): scikit-learn `LogisticRegression()` defaults on the frozen encoder's mean-pooled "
                 "embeddings of the same sample.")
    if "setfit" in anchors:
        L.append("  - `setfit` (anchor): SetFit 1.2, same body, batch 16, 1 epoch, `num_iterations=20`, logistic "
                 "regression head.")
    if notes:
        L += ["", "Skipped:", ""] + [f"- {n}" for n in notes]
    L += ["", "Metrics on the test half: accuracy and ECE (15 equal-width bins, Guo et al. 2017), mean ± sample std "
              "over seeds. `select acc`: accuracy on the selection half (best evaluation for fine-tuning rows). "
              "Time per run: training + evaluation on the test half and the out-of-domain files.", ""]
    for n, by_row in rows.items():
        L += [f"## N = {n} per class", "",
              "| row | seeds | test accuracy | ECE | macro-F1 | select acc | steps | wall s/run | CPU s/run |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for label, seeds in by_row.items():
            recs = list(seeds.values())
            steps = {r.get("steps") for r in recs if r.get("steps")}
            L.append(f"| {label} | {len(recs)} | {fmt_mean_std(ms(r['test']['accuracy'] for r in recs))} | "
                     f"{fmt_mean_std(ms(r['test']['ece'] for r in recs))} | "
                     f"{fmt_mean_std(ms(r['test'].get('f1_macro') for r in recs))} | "
                     f"{fmt_mean_std(ms(r['select'] for r in recs))} | {'/'.join(map(str, sorted(steps))) or '–'} | "
                     f"{ms(r['wall_s'] for r in recs)['mean']:.0f} | {ms(r['cpu_s'] for r in recs)['mean']:.0f} |")
        comps = [(a, b) for b in ("probe", "setfit") if b in by_row for a in by_row if a not in ("probe", "setfit")]
        comps += [("setfit", "probe")] if {"setfit", "probe"} <= set(by_row) else []
        if comps:
            L += ["", "Test accuracy paired over seeds against the anchors (difference = row − anchor; 95% CI from the "
                      "t distribution; two-sided paired t-test; wins = seeds where the row is better):", "",
                  "| comparison | n | difference | 95% CI | p (paired t) | wins |", "|---|---:|---:|---|---:|---:|"]
            for a, b in comps:
                c = fa.paired({k: r["test"]["accuracy"] for k, r in by_row[a].items()},
                              {k: r["test"]["accuracy"] for k, r in by_row[b].items()})
                diff = "–" if c["diff"] is None else f"{c['diff']:+.4f}"
                L.append(f"| {a} − {b} | {c['n']} | {diff} | {fmt_ci(c['ci95'])} | {fmt_p(c['t_pvalue'])} | "
                         f"{c['wins']}/{c['n']} |")
        rep = sections.get(n)
        comps = [c for c in rep.comparisons if c.metric in ("accuracy", "ece")] if rep else []
        if comps:
            L += ["", "Fine-tuning rows paired against CE (difference = row − CE; exact Wilcoxon signed-rank with "
                      "≥ 5 pairs):", "",
                  "| comparison | metric | n | difference | 95% CI | p (paired t) | p (Wilcoxon) |",
                  "|---|---|---:|---:|---|---:|---:|"]
            for c in comps:
                diff = "–" if c.diff is None else f"{c.diff:+.4f}"
                L.append(f"| {c.a} − {c.b} | {c.metric} | {c.n} | {diff} | {fmt_ci(c.ci95)} | "
                         f"{fmt_p(c.t_pvalue)} | {fmt_p(c.wilcoxon_pvalue)} |")
        if ood:
            L += ["", f"Out of domain (N = {n}): accuracy on `sentiment-ood/<domain>/dev.tsv` (300 balanced reviews "
                      "each), mean over seeds, and in brackets the share of reviews predicted negative "
                      "(0.50 is balanced; a collapse shows as ≈ 1.0 or 0.0):", "",
                  "| row | " + " | ".join(ood) + " | mean ECE |", "|---|" + "---:|" * (len(ood) + 1)]
            for label, seeds in by_row.items():
                recs = [r for r in seeds.values() if r.get("ood")]
                if not recs:
                    continue
                cells = [f"{ms(r['ood'][d]['accuracy'] for r in recs)['mean']:.3f} "
                         f"({ms(r['ood'][d]['pred_neg_share'] for r in recs)['mean']:.2f})" for d in ood]
                ece = ms(r["ood"][d]["ece"] for r in recs for d in ood)["mean"]
                L.append(f"| {label} | " + " | ".join(cells) + f" | {ece:.3f} |")
        if rep is not None:
            L += ["", f"Box plot: `{rel(rep.plot)}`; per-run reliability diagrams and t-SNE pictures (unless "
                      f"`--no-figures`): `<run>/figures/`."]
        L.append("")
    L += ["## Cost", "",
          f"- Whole study: **{cpu / 60:.1f} CPU-minutes** (user + system; training and evaluation of every run, "
          f"summed), {wall / 60:.1f} minutes wall-clock.",
          f"- Machine: {platform.machine()}, {os.cpu_count()} logical CPUs, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), device `{args.device}`"
          + (f", CUDA {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() and args.device != "cpu" else "")
          + ".", "", "| N | row | wall (s) | CPU (s) |", "|---:|---|---:|---:|"]
    for r in per_run:
        L.append(f"| {r['shots']} | {r['objective']} | {r['wall_s']:.0f} | {r['cpu_s']:.0f} |")
    L.append("")
    L.append("Each run's time is measured when it is made and stored in `<runs>/n<N>/<row>/cost.json` (anchors: "
             "`<runs>/n<N>/<anchor>/seed-<k>/result.json`); a resumed study reuses finished runs and their times.")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(L) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
