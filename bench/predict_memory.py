"""Peak memory of ``finetune predict`` against the number of rows, and against transformers'
``pipeline("text-classification")`` reading the same file the way its users do.

Each measurement is a fresh process: ``finetune predict MODEL -i rows.csv -o out.csv`` (CPU, batch
64), or a script that feeds ``pipeline("text-classification", model=MODEL, batch_size=64)`` a
generator over the CSV's text column and writes each prediction as it comes (the streaming use its
docs show). Peak RSS is the child's high-water mark as the kernel counts it
(``getrusage(RUSAGE_CHILDREN).ru_maxrss`` of a wrapper process that runs only that child).

The rows are quickstart-like review sentences (``scripts/make_quickstart_data.py``'s word lists)
with an id column. The model is a classifier folder both tools load: ``tiny`` (a 2-layer, 32-wide
random BERT with the embedded model's tokenizer: fast enough for 500k rows on a CPU) or
``embedded`` (all-MiniLM-L6-v2 with a fresh 2-label head).

    python bench/predict_memory.py [--rows 50000 500000] [--repeats 2] [--model tiny|embedded]

Targets: finetune's peak within 10% between the smallest and the largest row count; at the
smallest, at most the pipeline's.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parent.parent

PIPELINE = """
import csv, sys
from transformers import pipeline
model, src, dst = sys.argv[1:4]
def texts():
    with open(src, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            yield row["text"]
pipe = pipeline("text-classification", model=model, batch_size=64, device=-1)
with open(dst, "w", newline="", encoding="utf-8") as f:
    w = csv.writer(f)
    w.writerow(["label", "score"])
    for out in pipe(texts(), batch_size=64):
        w.writerow([out["label"], out["score"]])
"""

# Runs one child and reports its peak RSS (KiB on Linux): the wrapper has no other children.
MEASURE = """
import resource, subprocess, sys, time
t = time.perf_counter()
rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode
print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, time.perf_counter() - t)
"""


def write_rows(path: Path, n: int, seed: int = 0) -> None:
    spec = importlib.util.spec_from_file_location("mq", REPO / "scripts" / "make_quickstart_data.py")
    mq = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mq)  # type: ignore[union-attr]
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8", newline="") as f:
        f.write("text,id\n")
        for i in range(n):
            good = rng.random() < 0.5
            s = (f"{rng.choice(mq.OPENERS)}{rng.choice(mq.SUBJECTS)} {rng.choice(mq.POS if good else mq.NEG)}."
                 f"{rng.choice(mq.CLOSERS_POS if good else mq.CLOSERS_NEG)}")
            f.write(f"\"{s[0].upper() + s[1:]}\",{i}\n")


def build_model(kind: str, out: Path) -> Path:
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    sys.path.insert(0, str(REPO))
    from finetune_cli.models.loading import embedded_model_path

    torch.manual_seed(0)
    labels = {"id2label": {0: "negative", 1: "positive"}, "label2id": {"negative": 0, "positive": 1}}
    if kind == "tiny":
        cfg = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=512, num_labels=2, **labels)
        model = BertForSequenceClassification(cfg)
    else:
        model = BertForSequenceClassification.from_pretrained(embedded_model_path(), num_labels=2, **labels)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(embedded_model_path()).save_pretrained(out)
    return out


def measure(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(peak RSS in MB, seconds) of ``cmd`` run in a fresh process."""
    res = subprocess.run([sys.executable, "-c", MEASURE, *cmd], capture_output=True, text=True, env=env, check=True)
    rc, kib, secs = res.stdout.split()
    if rc != "0":
        raise SystemExit(f"{' '.join(cmd)} failed with exit code {rc}: {res.stderr[-2000:]}")
    return int(kib) / 1024, float(secs)


def summary(xs: list[float]) -> str:
    return f"{statistics.median(xs):7.0f} MB (min {min(xs):.0f}, max {max(xs):.0f}, n={len(xs)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[50_000, 500_000])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--model", choices=["tiny", "embedded"], default="tiny")
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    finetune = [sys.executable, "-c", "from finetune_cli.cli.main import app; app()"]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        model = build_model(args.model, tmp / "model")
        peaks: dict[str, list[float]] = {}
        for n in args.rows:
            write_rows(tmp / f"rows{n}.csv", n)
        for r in range(args.repeats):
            runs = [(f"finetune predict {n} rows", [*finetune, "predict", str(model), "-i", str(tmp / f"rows{n}.csv"),
                                                    "-o", str(tmp / "out.csv"), "--device", "cpu", "-q"])
                    for n in args.rows]
            runs.append((f"transformers pipeline {args.rows[0]} rows",
                         [sys.executable, "-c", PIPELINE, str(model), str(tmp / f"rows{args.rows[0]}.csv"),
                          str(tmp / "out_pipe.csv")]))
            for name, cmd in runs if r % 2 == 0 else runs[::-1]:  # alternate the order over repeats
                mb, secs = measure(cmd, env)
                peaks.setdefault(name, []).append(mb)
                print(f"  repeat {r + 1}: {name}: {mb:.0f} MB peak RSS, {secs:.1f} s", flush=True)
        print(f"\nmodel: {args.model}; peak RSS, median over {args.repeats} repeats (CPU, taken under load):")
        for name, xs in peaks.items():
            print(f"  {name:<36} {summary(xs)}")
        small, large = (statistics.median(peaks[f"finetune predict {n} rows"]) for n in (args.rows[0], args.rows[-1]))
        pipe = statistics.median(peaks[f"transformers pipeline {args.rows[0]} rows"])
        print(f"\nfinetune {args.rows[-1]} / {args.rows[0]} rows: {large / small:.3f}  (target <= 1.10)")
        print(f"finetune / pipeline at {args.rows[0]} rows: {small / pipe:.3f}  (target <= 1.00)")


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"({time.perf_counter() - t0:.0f} s)")
