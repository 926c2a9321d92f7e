"""SimCSE speed against sentence-transformers, measured in the same run on the same data.

1. Training: sentences/s of ``finetune train`` with ``simcse_unsup`` (one encoder pass over the
   doubled batch) vs ``SentenceTransformerTrainer`` + ``MultipleNegativesRankingLoss`` (scale 20 =
   1/τ) on (s, s) pairs (its SimCSE equivalent, two encoder passes): the embedded MiniLM, batch 64,
   max length 32, the same Wikipedia sentences, AdamW at the same lr, no evaluation, no saving
   during training. Each side reports its own training-loop throughput (model loading excluded).
   Target: >= 1.0x.
2. Inference: ``finetune embed``'s code path (``pipelines.embed.embed_texts``) vs
   ``SentenceTransformer.encode`` at batch 64 on the same sentences (tokenisation included for
   both). Target: >= 1.1x.

    python bench/simcse_throughput.py [--n 1280] [--embed-n 4096] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import os
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


def bench_finetune_train(texts: list[str], device: str, tmp: Path) -> float:
    from finetune_cli.pipelines.recipes import load_recipe
    from finetune_cli.pipelines.train import run_train
    from finetune_cli.ui import UI

    f = tmp / "sents.txt"
    f.write_text("\n".join(texts) + "\n")
    r = load_recipe("simcse_unsup", [f"data.train={f}", "~data.eval", "~data.max_train_samples",
                                     f"train.batch_size={BATCH}", f"model.max_length={MAXLEN}", f"train.lr={LR}",
                                     "train.eval_every=100000", "train.log_every=1000", "train.precision=fp32",
                                     "data.group_by_length=false", f"output.dir={tmp}", "output.name=ft"])
    out = run_train(r, UI(quiet=True), device=device)
    return float(out.summary["samples_per_second"])


def bench_st_train(texts: list[str], device: str, tmp: Path) -> float:
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    from finetune_cli.models.loading import embedded_model_path

    model = SentenceTransformer(str(embedded_model_path()), device=device)
    model.max_seq_length = MAXLEN
    ds = Dataset.from_dict({"anchor": texts, "positive": texts})
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp / "st"), per_device_train_batch_size=BATCH, num_train_epochs=1, learning_rate=LR,
        warmup_ratio=0.0, weight_decay=0.01, save_strategy="no", eval_strategy="no", logging_steps=10_000,
        report_to="none", seed=42, use_cpu=device == "cpu", dataloader_drop_last=False, disable_tqdm=True)
    tr = SentenceTransformerTrainer(model=model, args=args, train_dataset=ds,
                                    loss=MultipleNegativesRankingLoss(model, scale=20.0))
    out = tr.train()
    return float(out.metrics["train_samples_per_second"])


def bench_embed(texts: list[str], device: str) -> tuple[float, float, float]:
    from sentence_transformers import SentenceTransformer

    from finetune_cli.models.loading import embedded_model_path, load_text_model
    from finetune_cli.pipelines.embed import embed_texts

    model, tok, _ = load_text_model("embedded")
    model.to(device)
    st = SentenceTransformer(str(embedded_model_path()), device=device)
    st.max_seq_length = 128
    # the packaged model's own sentence-transformers config ends in Normalize(), so compare with
    # `finetune embed --normalize` (same work plus the normalisation)
    embed_texts(model, tok, texts[:128], batch_size=BATCH, device=torch.device(device))  # warm-up
    st.encode(texts[:128], batch_size=BATCH)
    t0 = time.perf_counter()
    a = embed_texts(model, tok, texts, batch_size=BATCH, max_length=128, normalize=True, device=torch.device(device))
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    b = st.encode(texts, batch_size=BATCH, convert_to_numpy=True)
    t_st = time.perf_counter() - t0
    diff = float(np.abs(a - b).max())
    return len(texts) / t_ours, len(texts) / t_st, diff


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1280, help="training sentences (n/64 steps)")
    ap.add_argument("--embed-n", type=int, default=4096)
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    torch.manual_seed(0)
    texts = sentences(max(a.n, a.embed_n))
    res = {"device": a.device, "batch": BATCH, "max_length": MAXLEN, "train_sentences": a.n}
    if not a.skip_train:
        with tempfile.TemporaryDirectory() as d:
            res["st_train_sents_per_s"] = round(bench_st_train(texts[: a.n], a.device, Path(d)), 2)
            res["finetune_train_sents_per_s"] = round(bench_finetune_train(texts[: a.n], a.device, Path(d)), 2)
        res["train_ratio"] = round(res["finetune_train_sents_per_s"] / res["st_train_sents_per_s"], 3)
    ours, st, diff = bench_embed(texts[: a.embed_n], a.device)
    res.update({"embed_sentences": a.embed_n, "finetune_embed_sents_per_s": round(ours, 1),
                "st_encode_sents_per_s": round(st, 1), "embed_ratio": round(ours / st, 3),
                "embed_max_abs_diff": diff})
    print(json.dumps(res, indent=2))
    if "train_ratio" in res:
        print(f"train: finetune {res['train_ratio']:.2f}x sentence-transformers MNRL (target >= 1.0x)")
    print(f"embed: finetune {res['embed_ratio']:.2f}x SentenceTransformer.encode (target >= 1.1x)")


if __name__ == "__main__":
    main()
