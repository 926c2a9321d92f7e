"""Wall time of a few-shot run against SetFit 1.2's at the same N, measured interleaved in one process.

Each round draws one sample (the round's seed) from a study task (SST-2 by default, N = 20 a class)
and runs every configuration on it in turn, SetFit first, the order rotated every round so none is
favoured by the state of a shared machine; a run is training plus the evaluation of its selection
half (the recipes evaluate it ~10 times to pick a checkpoint; SetFit predicts it once) and of the
test half. Reported per configuration: the median wall time, the median of the per-round ratios to
SetFit (paired, so slow drifts cancel), and the selection- and test-half accuracy of each round.

    python bench/fewshot_cost.py --data-dir ../shared/data --rounds 2 --threads 2 \
        --configs 'scl,scl1:scl:views=1:crop=0.5:train.min_steps=100' --json runs/bench/fewshot_cost.json

A configuration is a row of ``experiments/fewshot_study.py`` (``LABEL:RECIPE[:key=value...]``).
Target: the shipped few-shot SCL recipe at N = 20 takes no longer than SetFit (ratio <= 1.0).
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
    p.add_argument("--configs", default="scl", help="comma-separated study rows (default: %(default)s)")
    p.add_argument("--task", default="sst2")
    p.add_argument("--shots", type=int, default=20)
    p.add_argument("--rounds", type=int, default=2, help="one sample (seed) each")
    p.add_argument("--first-seed", type=int, default=1, help="round r draws seed first_seed + r")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--model", default="embedded")
    p.add_argument("--data-dir", default=os.environ.get("FINETUNE_SHARED_DATA", str(REPO.parent / "shared" / "data")))
    p.add_argument("--json", default=None, help="write every measurement here")
    return p.parse_args(argv)


def one_run(label: str, spec, args, files, seed: int, out: Path) -> dict:
    """Train and test one configuration on the round's sample in a fresh folder; its time and accuracies."""
    from finetune_cli.pipelines.recipes import load_plan
    from finetune_cli.ui import UI

    sargs = fs.parse_args(["--out", str(out), "--model", args.model, "--no-figures", "--keep", "none"])
    t0 = time.perf_counter()
    if label == "setfit":
        base = load_plan("fewshot/ce", fs.study_overrides(sargs, "ce", [], args.task, args.shots, files, "ce")).recipe
        embed = fs.fa.Embedder(args.model, base.model.max_length)
        (rec,) = fs.fa.run_anchor("setfit", base, [seed], files["test"], files["select"], out / "setfit",
                                  lambda: embed, fs.cpu_seconds, lambda *_: None)
        return {"wall_s": time.perf_counter() - t0, "select": rec["metrics"]["select"]["accuracy"],
                "test": rec["metrics"]["test"]["accuracy"]}
    name, extra = spec
    plan = load_plan(fs.recipe_name(name), fs.study_overrides(sargs, name, extra, args.task, args.shots, files, label))
    (rec,) = fs.run_row(sargs, plan, args.task, args.shots, label, [seed], UI(quiet=True), files["test"]).values()
    return {"wall_s": time.perf_counter() - t0, "select": rec["select"], "test": rec["test"]["accuracy"],
            "steps": rec["steps"]}


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    rows = {"setfit": None, **{lab: (name, extra) for lab, name, extra in fs.parse_objectives(args.configs)}}
    tmp = Path(tempfile.mkdtemp(prefix="fewshot_cost_"))
    files = fs.prepare_task(args.task, Path(args.data_dir), tmp)
    runs: dict[str, list[dict]] = {k: [] for k in rows}
    order = list(rows)
    for r in range(args.rounds):
        for label in order[r % len(order):] + order[:r % len(order)]:
            out = tmp / f"r{r}-{label}"
            seed = args.first_seed + r
            runs[label].append({"seed": seed, **one_run(label, rows[label], args, files, seed, out)})
            shutil.rmtree(out, ignore_errors=True)
            m = runs[label][-1]
            print(f"round {r + 1} (seed {seed}) {label}: {m['wall_s']:.0f} s, select {m['select']:.4f}, test {m['test']:.4f}",
                  file=sys.stderr, flush=True)
            if args.json:  # after every run, so an interrupted bench keeps what it measured
                Path(args.json).parent.mkdir(parents=True, exist_ok=True)
                Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs}, indent=2))
    print(f"| config | median wall s | ratio to SetFit (median of rounds) | select acc | test acc |  "
          f"({args.task}, N = {args.shots}, {args.rounds} rounds, torch threads {torch.get_num_threads()})")
    print("|---|---:|---:|---|---|")
    for label, ms in runs.items():
        ratios = [m["wall_s"] / s["wall_s"] for m, s in zip(ms, runs["setfit"], strict=True)]
        print(f"| {label} | {statistics.median(m['wall_s'] for m in ms):.0f} | {statistics.median(ratios):.2f} | "
              + " ".join(f"{m['select']:.3f}" for m in ms) + " | " + " ".join(f"{m['test']:.3f}" for m in ms) + " |")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
