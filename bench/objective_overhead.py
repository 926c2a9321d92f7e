"""Step time of every registered classification objective relative to cross-entropy, in one run.

Same encoder weights (the embedded all-MiniLM-L6-v2 by default, ``--model`` to change), same
batches (batch 32, max length 64; SST-2 train sentences from --data-dir / $FINETUNE_DATA_DIR, or
synthetic sentences when absent), same optimizer (AdamW, gradient clipping at 1.0 as the engine
does). A step is forward + backward + clip + optimizer step. Each objective gets its own copy of
the model (R4F needs its spectrally-normalised head); after a warm-up the objectives take turns
step by step, in an order rotated every round so none is favoured by cache or thermal state, and
each round uses the same batch for all of them. Reported: the median step time and the median of
the per-round ratios to CE (paired, so slow drifts of a shared machine cancel).

Objectives are read from the registry: any objective with class labels (``label_type ==
"class"``) is timed with its default hyper-parameters, so new ones appear without editing this file.

    python bench/objective_overhead.py --data-dir ../shared/data [--steps 15] [--warmup 3]

Targets: SCL <= 1.05x, Core-tuning <= 1.15x, Focal/Dice <= 1.02x, R3F/R4F <= 1.9x CE.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402

BATCH, MAXLEN = 32, 64
TARGETS = {"scl": 1.05, "core_tuning": 1.15, "focal": 1.02, "dice": 1.02, "r3f": 1.9, "r4f": 1.9}


def load_sentences(data_dir: str | None, n: int, seed: int = 0) -> tuple[list[str], list[int], str]:
    f = Path(data_dir) / "SST-2" / "train.tsv" if data_dir else None
    if f is not None and f.is_file():
        rows = [ln.rstrip("\n").split("\t") for ln in open(f, encoding="utf-8")][1:]
        random.Random(seed).shuffle(rows)
        rows = rows[:n]
        return [r[0] for r in rows], [int(r[1]) for r in rows], "SST-2"
    rng = random.Random(seed)
    words = "the a film movie good bad great awful plot acting was is not very quite truly boring fun".split()
    sents = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 40))) for _ in range(n)]
    return sents, [int("good" in s or "great" in s) for s in sents], "synthetic"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default=os.environ.get("FINETUNE_DATA_DIR"))
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--steps", type=int, default=15, help="timed steps per objective")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per objective first")
    ap.add_argument("--only", default=None, help="comma-separated objective names (ce is always included)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from finetune_cli.data.encode import EncodedData, collate, to_device
    from finetune_cli.models import HeadSpec, load_text_model
    from finetune_cli.objectives import build, get, names

    device = torch.device(args.device)
    objectives = [n for n in names() if get(n).label_type == "class" and get(n).needs_classifier]
    if args.only:
        keep = {"ce", *args.only.split(",")}
        objectives = [n for n in objectives if n in keep]
    objectives = ["ce", *[n for n in objectives if n != "ce"]]

    n_batches = args.steps + args.warmup
    sents, labels, source = load_sentences(args.data_dir, BATCH * n_batches)
    torch.manual_seed(0)
    base, tok, _ = load_text_model(args.model, HeadSpec(pooling="mean", num_labels=2))
    enc = tok(sents, truncation=True, max_length=MAXLEN, padding=False)
    data = EncodedData(views=[{k: list(enc[k]) for k in ("input_ids", "token_type_ids") if k in enc}],
                       labels=np.asarray(labels, dtype=np.int64),
                       lengths=np.asarray([len(x) for x in enc["input_ids"]]))
    order = np.random.default_rng(0).permutation(len(sents))
    batches = [to_device(collate(data, order[i * BATCH:(i + 1) * BATCH].tolist(), tok.pad_token_id), device)
               for i in range(n_batches)]

    runners = {}
    for name in objectives:
        cls = get(name)
        spec = HeadSpec(pooling="mean", num_labels=2, spectral_norm=cls.spectral_norm_head,
                        projection=cls.needs_projection)
        torch.manual_seed(0)
        model, *_ = load_text_model(args.model, spec)
        model.encoder.load_state_dict(copy.deepcopy(base.encoder.state_dict()))
        model.to(device).train()
        opt = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01)
        runners[name] = (model, build(name, {}).to(device), opt)
    del base

    def step(name: str, batch) -> float:
        model, obj, opt = runners[name]
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            out = obj(model, batch)
        out["loss"].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    times: dict[str, list[float]] = {n: [] for n in objectives}
    for r in range(n_batches):
        k = r % len(objectives)
        for name in objectives[k:] + objectives[:k]:  # rotate who goes first each round
            dt = step(name, batches[r])
            if r >= args.warmup:
                times[name].append(dt)

    ce = times["ce"]
    rows = []
    for name in objectives:
        ratio = statistics.median(t / c for t, c in zip(times[name], ce, strict=True))
        target = TARGETS.get(name)
        rows.append({"objective": name, "median_step_s": statistics.median(times[name]), "ratio_vs_ce": ratio,
                     "target": target, "met": None if target is None else ratio <= target})

    print(f"data: {source}, batch {BATCH}, max_length {MAXLEN}, model {args.model}, device {args.device}, "
          f"torch threads {torch.get_num_threads()}, {args.warmup} warm-up + {args.steps} timed steps each",
          file=sys.stderr)
    print(f"{'objective':<14}{'step s':>9}{'x CE':>8}{'target':>9}  met", file=sys.stderr)
    for r in rows:
        tgt = f"<={r['target']:.2f}" if r["target"] is not None else "-"
        met = "-" if r["met"] is None else ("yes" if r["met"] else "NO")
        print(f"{r['objective']:<14}{r['median_step_s']:>9.3f}{r['ratio_vs_ce']:>8.2f}{tgt:>9}  {met}", file=sys.stderr)
    if args.json:
        print(json.dumps({"source": source, "device": args.device, "model": args.model, "steps": args.steps,
                          "warmup": args.warmup, "results": rows}))


if __name__ == "__main__":
    main()
