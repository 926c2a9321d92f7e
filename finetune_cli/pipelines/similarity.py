"""``finetune eval`` of an embedding model on sentence pairs with gold scores: Spearman and
Pearson of the cosine similarities, plus alignment and uniformity (Wang & Isola 2020)."""

from __future__ import annotations

from typing import Optional

import numpy as np

from finetune_cli.data.tasks import data_dir_from_env
from finetune_cli.engine.inference import open_session
from finetune_cli.errors import DataError
from finetune_cli.metrics.similarity import (
    alignment,
    correlations,
    cosine_scores,
    positive_threshold,
    uniformity,
)
from finetune_cli.models.loading import has_classifier, resolve_model
from finetune_cli.pipelines.common import load_similarity_data
from finetune_cli.pipelines.evaluate import EvalResult
from finetune_cli.pipelines.recipes import Plan


def wants_similarity(model_name: str, plan: Plan) -> bool:
    """Similarity evaluation when the recipe's objective evaluates that way, or when the model
    has no classification head (a sentence-embedding model)."""
    if plan.evaluation == "similarity":
        return True
    path, is_local = resolve_model(model_name)
    if not is_local:
        return False
    return not has_classifier(path)


def similarity_metrics(a: np.ndarray, b: np.ndarray, gold: np.ndarray, texts_a: list[str],
                       texts_b: list[str]) -> dict[str, float]:
    """Correlations on all pairs; alignment on pairs with gold ≥ 4/5 of the scale; uniformity on
    every distinct sentence."""
    m = correlations(cosine_scores(a, b), gold)
    pos = gold >= positive_threshold(gold)
    if pos.any():
        m["alignment"] = alignment(a[pos], b[pos])
    first: dict[str, np.ndarray] = {}
    for t, e in zip(texts_a + texts_b, np.concatenate([a, b]), strict=True):
        first.setdefault(t, e)
    if len(first) > 1:
        m["uniformity"] = uniformity(np.stack(list(first.values())))
    m["positive_pairs"] = float(pos.sum())
    return m


def run_eval_similarity(model_name: str, plan: Plan, ui, *, device: str = "auto", precision: str = "auto",
                        data_dir: Optional[str] = None, batch_size: Optional[int] = None,
                        stride: Optional[int] = None) -> EvalResult:
    if stride is not None:
        raise DataError("--stride applies to a classifier; an embedding model is evaluated on sentence pairs, "
                        "cut by model.truncation")
    recipe = plan.recipe
    table = load_similarity_data(recipe, data_dir_from_env(data_dir))
    if table is None:
        raise DataError("no similarity data: set data.eval=FILE (text, text_pair and a gold score label)")
    sess = open_session(model_name, device=device, precision=precision, max_length=recipe.model.max_length,
                        length_key="model.max_length")
    enc = sess.encode(table, ("text", "text_pair"), joint=False)
    if (note := sess.length_note()) is not None:
        ui.warn(f"{table.source}: {note}")
    bs = batch_size or recipe.train.eval_batch_size
    with ui.progress(len(enc), "embed", transient=True) as prog:
        a = sess.forward(enc, bs, view=0, want=("embeddings",), progress=prog)["embeddings"]
        b = sess.forward(enc, bs, view=1, want=("embeddings",))["embeddings"]
    metrics = similarity_metrics(a, b, np.asarray(enc.labels, dtype=np.float64),
                                 [str(x) for x in table.columns["text"]], [str(x) for x in table.columns["text_pair"]])
    return EvalResult(model=sess.path, data=table.source, examples=len(enc), metrics=metrics,
                      precision=sess.precision)
