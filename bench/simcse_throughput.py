"""SimCSE training and embedding speed against sentence-transformers, measured fairly in one run.

1. Training (``--skip-train`` to leave out): ``finetune train`` with ``simcse_unsup`` (one encoder
   pass over the doubled batch) vs ``SentenceTransformerTrainer`` + ``MultipleNegativesRankingLoss``
   (scale 20 = 1/τ) on (s, s) pairs (its SimCSE equivalent, two encoder passes): the embedded
   MiniLM, batch 64, max length 32, the same Wikipedia sentences, AdamW at lr 3e-5 (fused in both),
   no evaluation or saving during training. Each runner in a fresh process; one clock around the
   same work (model loading, tokenisation, training: "end to end") and a per-step clock read by a
   callback in both ("ms/step", after ``--skip`` steps); runner order alternates over repeats.
   Target: finetune >= 1.5x MNRL.
2. Embedding: ``finetune embed``'s code path (``pipelines.embed.embed_texts`` with
   ``normalize=True``, tokenisation included) vs ``SentenceTransformer.encode`` called as its users
   call it (``encode(texts, batch_size=B)``; the packaged model's own pipeline ends in ``Normalize``),
   max length 128 for both, at batch 64 and 256. Both warmed up; the two alternate over
   ``--embed-repeats``. Target: >= 2.0x at both batch sizes.

    python bench/simcse_throughput.py [--n 1280] [--repeats 2] [--embed-n 4096] [--embed-repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402

BATCH, MAXLEN, LR = 64, 32, 3e-5
WIKI = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "SimCSE-wiki" / "wiki1m_for_simcse_head.txt"


def sentences(n: int) -> list[str]:
    if WIKI.is_file():
        lines = [s.strip() for s in WIKI.read_text(encoding="utf-8").splitlines() if s.strip()]
    else:  # synthetic fallback of similar length
        rng = np.random.default_rng(0)
        words = "the of and in to a was is for on as with by he at from his an were are which".split()
        lines = [" ".join(rng.choice(words, size=rng.integers(8, 30))) for _ in range(n)]
    return (lines * (n // len(lines) + 1))[:n]


class StepClock:
    def __init__(self, skip: int):
        self.skip, self.steps, self.t_skip, self.t_last = skip, 0, None, None

    def tick(self) -> None:
        self.steps += 1
        now = time.perf_counter()
        if self.steps == self.skip:
            self.t_skip = now
        self.t_last = now

    def ms_per_step(self):
        if self.t_skip is None or self.steps <= self.skip:
            return None
        return (self.t_last - self.t_skip) / (self.steps - self.skip) * 1e3


def train_finetune(texts: list[str], tmp: Path, clock: StepClock) -> None:
    try:  # this release; a `finetune@DIR` checkout of an older one takes a recipe
        from finetune_cli.pipelines.recipes import load_plan as load_recipe
    except ImportError:  # pragma: no cover
        from finetune_cli.pipelines.recipes import load_recipe
    from finetune_cli.pipelines.train import run_train
    from finetune_cli.ui import UI

    tmp.mkdir(parents=True, exist_ok=True)
    f = tmp / "sents.txt"
    f.write_text("\n".join(texts) + "\n")
    r = load_recipe("simcse_unsup", [f"data.train={f}", "~data.eval", "~data.max_train_samples",
                                     f"train.batch_size={BATCH}", f"model.max_length={MAXLEN}", f"train.lr={LR}",
                                     "train.eval_every=100000", "train.precision=fp32", "train.weight_decay=0.01",
                                     f"output.dir={tmp}", "output.name=ft"])
    run_train(r, UI(quiet=True), device="cpu", overwrite=True, callbacks=[lambda tr, st: clock.tick()])


def train_st(texts: list[str], tmp: Path, clock: StepClock) -> None:
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from transformers import TrainerCallback

    from finetune_cli.models.loading import embedded_model_path

    model = SentenceTransformer(str(embedded_model_path()), device="cpu")
    model.max_seq_length = MAXLEN
    ds = Dataset.from_dict({"anchor": texts, "positive": texts})
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp / "st"), per_device_train_batch_size=BATCH, num_train_epochs=1, learning_rate=LR,
        warmup_ratio=0.0, weight_decay=0.01, save_strategy="no", eval_strategy="no", logging_steps=10_000,
        report_to="none", seed=42, use_cpu=True, dataloader_drop_last=False, disable_tqdm=True,
        optim="adamw_torch_fused")

    class Tick(TrainerCallback):
        def on_step_end(self, *a, **k):
            clock.tick()

    SentenceTransformerTrainer(model=model, args=args, train_dataset=ds,
                               loss=MultipleNegativesRankingLoss(model, scale=20.0), callbacks=[Tick()]).train()


def train_worker(a) -> None:
    texts = sentences(a.n)
    fn = train_finetune if a.worker == "finetune" else train_st
    with tempfile.TemporaryDirectory() as d:
        os.environ["FINETUNE_CACHE"] = str(Path(d) / "cache")
        fn(texts[: 2 * BATCH], Path(d) / "warm", StepClock(1))  # warm-up: two steps, fresh model
        clock = StepClock(a.skip)
        t0 = time.perf_counter()
        fn(texts, Path(d) / "timed", clock)
        dt = time.perf_counter() - t0
    print(json.dumps({"train_s": dt, "ms_per_step": clock.ms_per_step(), "steps": clock.steps}))


def bench_embed(texts: list[str], batch: int, repeats: int) -> dict:
    from sentence_transformers import SentenceTransformer

    from finetune_cli.engine.inference import open_session
    from finetune_cli.models.loading import embedded_model_path
    from finetune_cli.pipelines.embed import embed_texts

    sess = open_session("embedded", device="cpu", max_length=128)
    st = SentenceTransformer(str(embedded_model_path()), device="cpu")
    st.max_seq_length = 128

    def ours():
        return embed_texts(sess, texts, batch_size=batch, normalize=True)

    def theirs():
        return st.encode(texts, batch_size=batch)

    ours_t, st_t = [], []
    ours(), theirs()  # warm-up over every width both will see
    for r in range(repeats):
        for name in (("ours", "st") if r % 2 == 0 else ("st", "ours")):
            t0 = time.perf_counter()
            out = ours() if name == "ours" else theirs()
            (ours_t if name == "ours" else st_t).append(time.perf_counter() - t0)
            if name == "ours":
                a = out
            else:
                b = out
    n = len(texts)
    return {"batch": batch, "finetune_sent_per_s": [n / t for t in ours_t], "st_sent_per_s": [n / t for t in st_t],
            "ratio": statistics.median(st_t) / statistics.median(ours_t), "max_abs_diff": float(np.abs(a - b).max())}


def spread(xs, fmt="{:.1f}") -> str:
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1280, help="training sentences (n/64 steps)")
    ap.add_argument("--repeats", type=int, default=2, help="training repeats per runner (order alternates)")
    ap.add_argument("--skip", type=int, default=3, help="steps before the ms/step clock starts")
    ap.add_argument("--embed-n", type=int, default=4096)
    ap.add_argument("--embed-batches", default="64,256")
    ap.add_argument("--embed-repeats", type=int, default=3)
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument("--skip-embed", action="store_true")
    ap.add_argument("--worker", choices=("finetune", "st"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return train_worker(a)
    torch.manual_seed(0)
    res: dict = {"device": "cpu", "threads": torch.get_num_threads()}
    if not a.skip_train:
        runs: dict[str, list[dict]] = {"finetune": [], "st": []}
        for r in range(a.repeats):
            for w in (("finetune", "st") if r % 2 == 0 else ("st", "finetune")):
                p = subprocess.run([sys.executable, __file__, "--worker", w, "--n", str(a.n), "--skip", str(a.skip)],
                                   capture_output=True, text=True)
                if p.returncode != 0:
                    sys.exit(f"{w} failed:\n{p.stderr[-4000:]}")
                runs[w].append(json.loads(p.stdout.strip().splitlines()[-1]))
                print(f"  train repeat {r + 1} {w:<9} {runs[w][-1]['train_s']:.1f}s  "
                      f"{runs[w][-1]['ms_per_step']:.0f} ms/step", file=sys.stderr, flush=True)
        sps = {w: [a.n / x["train_s"] for x in rs] for w, rs in runs.items()}
        ms = {w: [x["ms_per_step"] for x in rs] for w, rs in runs.items()}
        res["train"] = {"sentences": a.n, "batch": BATCH, "max_length": MAXLEN, "runs": runs,
                        "ratio_end_to_end": statistics.median(sps["finetune"]) / statistics.median(sps["st"]),
                        "ratio_per_step": statistics.median(ms["st"]) / statistics.median(ms["finetune"])}
        print(f"train ({a.n} sentences, batch {BATCH}, max_length {MAXLEN}; median (min-max) over {a.repeats}):",
              file=sys.stderr)
        for w in runs:
            print(f"  {w:<9} {spread(sps[w])} sent/s end to end   {spread(ms[w])} ms/step", file=sys.stderr)
        t = res["train"]
        print(f"  finetune / MNRL: {t['ratio_end_to_end']:.2f}x end to end, {t['ratio_per_step']:.2f}x per step "
              f"(target >= 1.5x)", file=sys.stderr)
    if not a.skip_embed:
        texts = sentences(a.embed_n)
        res["embed"] = []
        for b in (int(x) for x in a.embed_batches.split(",")):
            e = bench_embed(texts, b, a.embed_repeats)
            res["embed"].append(e)
            print(f"embed ({a.embed_n} sentences, batch {b}, median (min-max) over {a.embed_repeats}): finetune "
                  f"{spread(e['finetune_sent_per_s'])} vs ST encode {spread(e['st_sent_per_s'])} sent/s -> "
                  f"{e['ratio']:.2f}x (target >= 2.0x), max |diff| {e['max_abs_diff']:.1e}", file=sys.stderr)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
