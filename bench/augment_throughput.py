"""Back-translation throughput: `finetune augment`'s batched, length-sorted generation against a naive
one-sentence-at-a-time loop, same tiny random Marian model, same sentences, same settings, one run.

The model is built offline (tests/marian_tiny.py: SentencePiece tokenizer trained on the packaged
quickstart sentences, random weights), so the ratio measures the generation machinery, not
translation quality. Sentences: SST-2 train from --data-dir / $FINETUNE_DATA_DIR when present, else
the packaged quickstart sentences.

    python bench/augment_throughput.py [--n 128] [--batch-size 32] [--repeats 2] [--device cpu|cuda] [--temperature 0.9]

Target: batched >= 5x the naive loop's sentences/s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from finetune_cli.augment.backtranslate import BackTranslator, SamplingSpec, load_seq2seq  # noqa: E402
from tests.marian_tiny import build_tiny_marian, corpus_sentences  # noqa: E402


def load_sentences(data_dir: str | None, n: int, seed: int = 0) -> tuple[list[str], str]:
    f = Path(data_dir) / "SST-2" / "train.tsv" if data_dir else None
    if f is not None and f.is_file():
        rows = [ln.split("\t")[0] for ln in f.read_text(encoding="utf-8").splitlines()[1:]]
        random.Random(seed).shuffle(rows)
        return rows[:n], "SST-2"
    sents = corpus_sentences()
    random.Random(seed).shuffle(sents)
    return (sents * (n // len(sents) + 1))[:n], "quickstart"


def naive(bt: BackTranslator, texts: list[str], seed: int) -> list[str]:
    """What a first attempt looks like: one generate() call per sentence, each direction."""
    torch.manual_seed(seed)
    out = []
    kw = bt.spec.generate_kwargs(1)
    for t in texts:
        pair = []
        for m, src in ((bt.forward, t), (bt.backward, None)):
            src = src if src is not None else pair[-1]
            if not src.strip():  # like the batched path: an empty text (or pivot) is not sent to the model
                pair.append("")
                continue
            enc = m.tokenizer([src], return_tensors="pt", truncation=True, max_length=bt.spec.max_length)
            enc = {k: v.to(next(m.model.parameters()).device) for k, v in enc.items()}
            with torch.inference_mode():
                gen = m.model.generate(**enc, **kw, max_new_tokens=bt.spec.max_length)
            pair.append(m.tokenizer.decode(gen[0], skip_special_tokens=True))
        out.append(pair[-1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=0.9)
    ap.add_argument("--max-length", type=int, default=32)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--data-dir", default=os.environ.get("FINETUNE_DATA_DIR"))
    args = ap.parse_args()

    texts, source = load_sentences(args.data_dir, args.n)
    dev = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        fwd_dir = build_tiny_marian(Path(tmp) / "fwd", seed=0)
        bwd_dir = build_tiny_marian(Path(tmp) / "bwd", seed=1)
        spec = SamplingSpec(temperature=args.temperature, max_length=args.max_length)
        bt = BackTranslator(load_seq2seq(str(fwd_dir), dev), load_seq2seq(str(bwd_dir), dev), spec, args.batch_size)
        # Warm-up: the first generate() at a new batch shape is far slower on CPU (kernel selection), so
        # each contestant runs once untimed; then the best of --repeats timed runs counts.
        results = {}
        for name, fn in (("batched", lambda: bt(texts, seed=0)), ("naive", lambda: naive(bt, texts, seed=0))):
            fn()
            times = []
            for _ in range(args.repeats):
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                outs = fn()
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            dt = min(times)
            results[name] = {"seconds": round(dt, 3), "sentences_per_second": round(len(texts) / dt, 2),
                             "all_seconds": [round(t, 3) for t in times],
                             "empty_outputs": sum(not (o[0] if isinstance(o, list) else o) for o in outs)}
    ratio = results["batched"]["sentences_per_second"] / results["naive"]["sentences_per_second"]
    print(json.dumps({"bench": "augment_throughput", "device": str(dev), "sentences": len(texts), "source": source,
                      "batch_size": args.batch_size, "temperature": args.temperature, "max_length": args.max_length,
                      "torch_threads": torch.get_num_threads(), **results, "speedup": round(ratio, 2),
                      "target": 5.0, "meets_target": ratio >= 5.0}, indent=2))


if __name__ == "__main__":
    main()
