"""``finetune eval``: a trained model (run directory, model folder or hub id) on a labelled set, by
what the model is: a classifier by its problem type, an embedding model on sentence pairs with gold
scores (Spearman and Pearson of the cosines, alignment and uniformity, Wang & Isola 2020)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from finetune_cli.data.tasks import data_dir_from_env, load_task_data
from finetune_cli.engine.inference import open_session, parse_threshold
from finetune_cli.errors import DataError, ModelError
from finetune_cli.fsutil import check_writable_dir
from finetune_cli.metrics.calibration import DEFAULT_BINS
from finetune_cli.metrics.similarity import (
    alignment,
    correlations,
    cosine_scores,
    positive_threshold,
    uniformity,
)
from finetune_cli.metrics.tasks import LABEL_TYPES, per_label, task_metrics
from finetune_cli.models.loading import ModelInfo, describe_model
from finetune_cli.pipelines.common import load_similarity_data
from finetune_cli.pipelines.recipes import Plan, load_plan, plan_for
from finetune_cli.recipe import apply_overrides, build_recipe, to_plain
from finetune_cli.rundir import RunDir


@dataclass
class EvalResult:
    model: str
    data: str
    examples: int
    metrics: dict[str, float]
    # classification in depth (see ``classification_details``); None for other tasks
    labels: Optional[list[str]] = None
    per_class: Optional[list[dict[str, Any]]] = None
    confusion_matrix: Optional[list[list[int]]] = None
    calibration: Optional[dict[str, Any]] = None
    figures: Optional[dict[str, str]] = None
    saved_to: Optional[str] = None
    precision: Optional[str] = None  # what the model ran in: fp32, bf16 or fp16
    thresholds: Optional[dict[str, float]] = None  # multi-label: each label's decision threshold

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def eval_plan(model: str, recipe_path: Optional[str], overrides: list[str]) -> Plan:
    """The plan that says which data to read: ``--recipe``, else the run directory's own."""
    if recipe_path is not None:
        return load_plan(recipe_path, overrides)
    run = RunDir(model)
    if run.path.is_dir() and run.is_run():
        stored = run.read_recipe()
        return plan_for(build_recipe(apply_overrides(to_plain(stored), overrides), stored.source)
                        if overrides else stored)
    p = Path(model)
    if not p.exists() and (p.parent != Path(".") or model.startswith((".", "/", "~"))):
        raise ModelError(f"model path does not exist: {model} (no such run directory or model folder)")
    if overrides:
        return plan_for(build_recipe(apply_overrides({}, overrides), "<command line>"))
    raise DataError(f"no evaluation data: {model} is not a run directory; pass --recipe or data.eval=FILE")


def evaluate(model_name: str, plan: Plan, ui, *, device: str = "auto", precision: str = "auto",
             data_dir: Optional[str] = None, batch_size: Optional[int] = None, bins: int = DEFAULT_BINS,
             figures: bool = True, out: Optional[str] = None, tsne_max: Optional[int] = 2000,
             name: str = "eval", stride: Optional[int] = None, threshold: Optional[str] = None,
             cuda_graphs: str = "off") -> EvalResult:
    """``finetune eval``: the evaluation keyed by what the model is (:func:`describe_model`, read
    before any weight): a classifier by its problem type (its labels read with its own
    ``id2label``), a model without a classifier (or any model under a recipe whose objective
    evaluates by similarity) by the STS metrics of its embeddings. The plan is resolved once (by
    the caller) and the data read once, before the weights load, so a bad file costs no model load.

    ``name``: the result file's stem in the output folder (``eval.json``; the CLI names evaluations
    of other data than the run's own ``eval-<recipe>.json`` so ``report`` keeps reading the run's);
    ``threshold``: a multi-label model's decisions (``InferenceSession.decision_threshold``)."""
    parse_threshold(threshold)
    info = describe_model(model_name)
    ddir = data_dir_from_env(data_dir)
    if plan.evaluation == "similarity" or not info.has_classifier:
        if threshold is not None:
            raise DataError(f"--threshold {threshold}: {model_name} is evaluated as an embedding model; the "
                            f"threshold decides the labels of a multi_label_classification model only")
        return _similarity(model_name, plan, ui, device=device, precision=precision, data_dir=ddir,
                           batch_size=batch_size, stride=stride, cuda_graphs=cuda_graphs)
    return _classification(model_name, info, plan, ui, device=device, precision=precision, data_dir=ddir,
                           batch_size=batch_size, bins=bins, figures=figures, out=out, tsne_max=tsne_max, name=name,
                           stride=stride, threshold=threshold, cuda_graphs=cuda_graphs)


def _classification(model_name: str, info: ModelInfo, plan: Plan, ui, *, device: str, precision: str,
                    data_dir: Optional[Path], batch_size: Optional[int], bins: int, figures: bool, out: Optional[str],
                    tsne_max: Optional[int], name: str, stride: Optional[int], threshold: Optional[str],
                    cuda_graphs: str) -> EvalResult:
    """The road of a classifier: the metrics of its problem type, and for single-label classes the
    per-class scores, confusion matrix, calibration and figures."""
    out_dir = eval_output_dir(model_name, out)
    if out_dir is not None:
        check_writable_dir(out_dir, "--out folder" if out is not None else "run directory")
    recipe, spec = plan.recipe, info.spec
    # The model says what it predicts (a folder someone else trained included): its problem type
    # and its id2label decide how the evaluation labels are read (``train.metric`` is training's
    # choice and plays no part here).
    lt = LABEL_TYPES.get(spec.problem_type, "class")
    names = info.label_names if lt in ("class", "multi") else None
    data = load_task_data(dataclasses.replace(recipe.data, label_names=names), seed=recipe.train.seed,
                          label_type=lt, required_columns=("text", "label"), data_dir=data_dir,
                          need_train=False, need_eval=True)
    assert data.eval is not None
    for note in data.notes:
        ui.warn(note)
    sess = open_session(model_name, device=device, precision=precision, max_length=recipe.model.max_length,
                        length_key="model.max_length", cuda_graphs=cuda_graphs)
    # Cut as the model was trained (its saved model.truncation), or read in windows (``stride``).
    enc = sess.encode(data.eval, plan.text_columns, joint=plan.joint, stride=stride)
    if (note := sess.length_note(stride)) is not None:
        ui.warn(f"{data.eval.source}: {note}")
    want = ("logits", "embeddings") if lt == "class" else ("logits",)
    with ui.progress(len(enc), "eval", transient=True) as prog:
        outs = sess.forward(enc, batch_size or recipe.train.eval_batch_size, want=want, progress=prog)
    logits = outs["logits"]
    left_out: dict[str, str] = {}
    labels = enc.row_labels
    cut = sess.decision_threshold(threshold)
    metrics = task_metrics(lt, logits, labels, cut, left_out)
    for why in dict.fromkeys(left_out.values()):
        ui.warn(f"{', '.join(k for k, v in left_out.items() if v == why)} not computed: {why}")
    res = EvalResult(model=sess.path, data=data.eval.source, examples=enc.rows, metrics=metrics,
                     precision=sess.precision, thresholds=per_label(cut, names or [], spec.problem_type))
    if lt == "class":
        from finetune_cli.pipelines.eval_details import classification_details

        classification_details(res, logits, outs["embeddings"], labels, names or [], ui, bins=bins,
                               figures=figures, out_dir=out_dir, tsne_max=tsne_max,
                               seed=recipe.train.seed, name=name)
    return res


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


def _similarity(model_name: str, plan: Plan, ui, *, device: str, precision: str, data_dir: Optional[Path],
                batch_size: Optional[int], stride: Optional[int], cuda_graphs: str) -> EvalResult:
    """The road of a model evaluated by its embeddings: Spearman and Pearson of the pairs' cosines
    against the gold scores, alignment and uniformity (Wang & Isola 2020)."""
    if stride is not None:
        raise DataError("--stride applies to a classifier; an embedding model is evaluated on sentence pairs, "
                        "cut by model.truncation")
    recipe = plan.recipe
    table = load_similarity_data(recipe, data_dir)
    if table is None:
        raise DataError("no similarity data: set data.eval=FILE (text, text_pair and a gold score label)")
    sess = open_session(model_name, device=device, precision=precision, max_length=recipe.model.max_length,
                        length_key="model.max_length", cuda_graphs=cuda_graphs)
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


def eval_output_dir(model_name: str, out: Optional[str]) -> Optional[Path]:
    """Where ``eval.json`` and figures go: ``--out``, else the run directory that was evaluated."""
    if out is not None:
        return Path(out)
    p = Path(model_name)
    return p if p.is_dir() and RunDir(p).is_run() else None
