"""Wall time of each shipped few-shot recipe against SetFit 1.2's at the same N, interleaved in one process.

For every task and N (``--tasks``, ``--shots``), each round draws one sample (the round's seed) and
runs every configuration on it in turn, SetFit as its users run it (its defaults for a few-shot
run: batch 16, 1 epoch, ``num_iterations=20``, logistic-regression head, the same body), the order
rotated every round so none is favoured by the state of the machine; a run is training plus the
evaluation of the selection half (the recipes evaluate it several times to pick a checkpoint; SetFit
predicts it once) and of the test half. Reported per task, N and configuration: the median wall time
with its range over rounds, the median of the per-round ratios to SetFit (paired, so slow drifts
cancel) and the accuracies of each round.

    python bench/fewshot_cost.py --data-dir ../shared/data --tasks sst2 --shots 8,20,64 --rounds 3 --threads 2 \
        --configs ce,scl,fastfit --json runs/bench/fewshot_cost.json

A configuration is a row of ``experiments/fewshot_study.py`` (``LABEL:RECIPE[:key=value...]``).
Target (issue 45): every shipped few-shot recipe's ratio <= 1.0 at every N. Run it on an idle
machine (``uptime``); ``--max-steps`` is for smoke runs only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "experiments"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import fewshot_study as fs  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default="ce,scl,fastfit", help="comma-separated study rows (default: %(default)s)")
    p.add_argument("--tasks", default="sst2", help="comma-separated study tasks (default: %(default)s)")
    p.add_argument("--shots", default="8,20,64", help="examples per class, comma-separated (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="one sample (seed) each")
    p.add_argument("--first-seed", type=int, default=1, help="round r draws seed first_seed + r")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--max-steps", type=int, default=None, help="optimizer steps per recipe run (smoke runs)")
    p.add_argument("--model", default="embedded")
    p.add_argument("--data-dir", default=os.environ.get("FINETUNE_SHARED_DATA", str(REPO.parent / "shared" / "data")))
    p.add_argument("--json", default=None, help="write every measurement here")
    return p.parse_args(argv)


def one_run(label: str, spec, args, task: str, shots: int, files, seed: int, out: Path) -> dict:
    """Train and test one configuration on the round's sample in a fresh folder; its time and accuracies."""
    from finetune_cli.pipelines.recipes import load_plan
    from finetune_cli.ui import UI

    sargs = fs.parse_args(["--out", str(out), "--model", args.model, "--no-figures", "--keep", "none",
                           *(["--max-steps", str(args.max_steps)] if args.max_steps else [])])
    t0 = time.perf_counter()
    if label == "setfit":
        base = load_plan("fewshot/ce", fs.study_overrides(sargs, "ce", [], task, shots, files, "ce")).recipe
        embed = fs.fa.Embedder(args.model, base.model.max_length)
        (rec,) = fs.fa.run_anchor("setfit", base, [seed], files["test"], files["select"], out / "setfit",
                                  lambda: embed, fs.cpu_seconds, lambda *_: None)
        return {"wall_s": time.perf_counter() - t0, "select": rec["metrics"]["select"]["accuracy"],
                "test": rec["metrics"]["test"]["accuracy"]}
    name, extra = spec
    plan = load_plan(fs.recipe_name(name), fs.study_overrides(sargs, name, extra, task, shots, files, label))
    ledger = fs.Ledger(out / "ledger.jsonl")  # a fresh one: every run is trained, never reused
    (rec,) = fs.run_row(sargs, plan, task, shots, label, [seed], UI(quiet=True), files["test"], ledger,
                        plan.recipe.fingerprint()).values()
    return {"wall_s": time.perf_counter() - t0, "select": rec["select"], "test": rec["test"]["accuracy"],
            "steps": rec["steps"]}


def bench_cell(task: str, shots: int, rows: dict, args, files, tmp: Path, runs: dict[str, list[dict]], save) -> None:
    """Every configuration on ``rounds`` samples of one task at one N, interleaved (into ``runs``)."""
    order = list(rows)
    for r in range(args.rounds):
        for label in order[r % len(order):] + order[:r % len(order)]:
            out = tmp / f"{task}-n{shots}-r{r}-{label}"
            seed = args.first_seed + r
            runs[label].append({"seed": seed, **one_run(label, rows[label], args, task, shots, files, seed, out)})
            shutil.rmtree(out, ignore_errors=True)
            m = runs[label][-1]
            print(f"{task} N={shots} round {r + 1} (seed {seed}) {label}: {m['wall_s']:.0f} s, select {m['select']:.4f}, "
                  f"test {m['test']:.4f}", file=sys.stderr, flush=True)
            save()  # after every run, so an interrupted bench keeps what it measured


def table(task: str, shots: int, runs: dict[str, list[dict]], threads: int) -> str:
    n = len(runs["setfit"])
    out = [f"{task}, N = {shots} a class, {n} rounds, torch threads {threads}", "",
           "| config | median wall s (range) | ratio to SetFit: median (range) | select acc | test acc |",
           "|---|---:|---:|---|---|"]
    for label, ms in runs.items():
        walls = [m["wall_s"] for m in ms]
        ratios = [m["wall_s"] / s["wall_s"] for m, s in zip(ms, runs["setfit"], strict=True)]
        out.append(f"| {label} | {statistics.median(walls):.0f} ({min(walls):.0f}–{max(walls):.0f}) | "
                   f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}) | "
                   + " ".join(f"{m['select']:.3f}" for m in ms) + " | " + " ".join(f"{m['test']:.3f}" for m in ms) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    rows = {"setfit": None, **{lab: (name, extra) for lab, name, extra in fs.parse_objectives(args.configs)}}
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    shots = [int(n) for n in args.shots.split(",") if n.strip()]
    tmp = Path(tempfile.mkdtemp(prefix="fewshot_cost_"))
    results: dict[str, dict] = {}

    def save() -> None:
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps({"args": vars(args), "runs": results}, indent=2))

    try:
        for task in tasks:
            files = fs.prepare_task(task, Path(args.data_dir), tmp / task)
            for n in shots:
                results[f"{task}/n{n}"] = runs = {k: [] for k in rows}
                bench_cell(task, n, rows, args, files, tmp, runs, save)
        for key, runs in results.items():
            task, n = key.split("/n")
            print(table(task, int(n), runs, torch.get_num_threads()) + "\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
