"""Computing one chunk of ``finetune augment``'s output (back-translation or edits, with the chrF
of each variant against its input), and the summary over the chunks written."""

from __future__ import annotations

import json
from pathlib import Path

from finetune_cli.augment.config import AugmentConfig
from finetune_cli.augment.edits import edit_text, row_rng
from finetune_cli.augment.io import InputData, chunk_path, chunk_seed
from finetune_cli.errors import DataError


def chrf_metric():
    try:
        from sacrebleu.metrics import CHRF
    except ImportError:
        raise DataError("the augment summary needs sacrebleu (pip install 'finetune-cli[augment]')") from None
    return CHRF()


def compute_chunk(cfg: AugmentConfig, data: InputData, start: int, stop: int, k: int, translator, chrf,
                   progress) -> list[dict]:
    cols = data.text_columns
    n_ret = cfg.num_return
    texts = [str(data.columns[c][i]) for i in range(start, stop) for c in cols]  # row-major, all sides pooled
    if translator is not None:
        outs = translator(texts, num_return=n_ret, seed=chunk_seed(cfg.seed, k), progress=progress)
    else:
        outs = []
        for j, t in enumerate(texts):
            row, col = start + j // len(cols), j % len(cols)
            outs.append([edit_text(t, cfg.edits, row_rng(cfg.seed, row, v, col)) for v in range(n_ret)])
    recs = []
    for r, i in enumerate(range(start, stop)):
        variants, scores = [], []
        for v in range(n_ret):
            sides = [outs[r * len(cols) + c][v] for c in range(len(cols))]
            variants.append(sides)
            scores.append([chrf.sentence_score(hyp, [texts[r * len(cols) + c]]).score for c, hyp in enumerate(sides)])
        recs.append({"row": i, "out": variants, "chrf": scores})
    return recs


def chunk_summary(data: InputData, parts: Path, n_chunks: int) -> tuple[float, float]:
    """(fraction of texts the augmentation changed, mean chrF) over every chunk written."""
    changed = total = 0
    chrf_sum = 0.0
    for k in range(n_chunks):
        for ln in chunk_path(parts, k).read_text(encoding="utf-8").splitlines():
            rec = json.loads(ln)
            i = rec["row"]
            for sides, scores in zip(rec["out"], rec["chrf"], strict=True):
                for c, (hyp, sc) in enumerate(zip(sides, scores, strict=True)):
                    total += 1
                    changed += hyp != " ".join(str(data.columns[data.text_columns[c]][i]).split())
                    chrf_sum += sc
    return (changed / total if total else 0.0), (chrf_sum / total if total else 0.0)
