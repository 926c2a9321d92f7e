"""``finetune eval``: a trained model (run directory, model folder or hub id) on a labelled set."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from finetune_cli.data.tasks import data_dir_from_env, load_task_data
from finetune_cli.engine.inference import open_session, parse_threshold
from finetune_cli.errors import DataError, ModelError
from finetune_cli.fsutil import check_writable_dir
from finetune_cli.metrics.calibration import DEFAULT_BINS
from finetune_cli.metrics.tasks import LABEL_TYPES, per_label, task_metrics
from finetune_cli.pipelines.common import load_data
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


def run_eval(model_name: str, plan: Plan, ui, *, device: str = "auto", precision: str = "auto",
             data_dir: Optional[str] = None, batch_size: Optional[int] = None, bins: int = DEFAULT_BINS,
             figures: bool = True, out: Optional[str] = None, tsne_max: Optional[int] = 2000,
             name: str = "eval", stride: Optional[int] = None, threshold: Optional[str] = None) -> EvalResult:
    """``name``: the result file's stem in the output folder (``eval.json``; the CLI names evaluations
    of other data than the run's own ``eval-<recipe>.json`` so ``report`` keeps reading the run's);
    ``threshold``: a multi-label model's decisions (``InferenceSession.decision_threshold``)."""
    recipe = plan.recipe
    parse_threshold(threshold)
    out_dir = eval_output_dir(model_name, out)
    if out_dir is not None:
        check_writable_dir(out_dir, "--out folder" if out is not None else "run directory")
    ddir = data_dir_from_env(data_dir)
    if recipe.data.eval is not None:  # a local file is read (and refused) before any model loads
        load_task_data(dataclasses.replace(recipe.data, train=None, label_names=None), seed=recipe.train.seed,
                       label_type=None, required_columns=plan.objective_cls.required_columns, data_dir=ddir,
                       need_train=False, need_eval=True)
    sess = open_session(model_name, device=device, precision=precision, max_length=recipe.model.max_length,
                        length_key="model.max_length")
    model, path = sess.model, sess.path
    if not model.has_classifier:
        raise ModelError(f"model {path} has no classification head (an embedding model); `finetune eval` needs a "
                         f"classifier — use `finetune embed`, or train one")
    # The model says what it predicts (a folder someone else trained included): its problem type
    # and its id2label decide how the evaluation labels are read.
    spec = model.spec
    lt = LABEL_TYPES.get(spec.problem_type, "class")
    names = sess.label_names if lt in ("class", "multi") else None
    # (``train.metric`` is training's choice: the model's problem type decides what is computed here)
    plan = plan.with_recipe(dataclasses.replace(
        recipe, data=dataclasses.replace(recipe.data, label_names=names),
        model=dataclasses.replace(recipe.model, problem_type=spec.problem_type),
        train=dataclasses.replace(recipe.train, metric=None)))
    data = load_data(plan, ddir, need_train=False, need_eval=True)
    assert data.eval is not None
    for note in data.notes:
        ui.warn(note)
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
    res = EvalResult(model=path, data=data.eval.source, examples=enc.rows, metrics=metrics, precision=sess.precision,
                     thresholds=per_label(cut, names or [], spec.problem_type))
    if lt == "class":
        from finetune_cli.pipelines.eval_details import classification_details

        classification_details(res, logits, outs["embeddings"], labels, names or [], ui, bins=bins,
                               figures=figures, out_dir=out_dir, tsne_max=tsne_max,
                               seed=recipe.train.seed, name=name)
    return res


def eval_output_dir(model_name: str, out: Optional[str]) -> Optional[Path]:
    """Where ``eval.json`` and figures go: ``--out``, else the run directory that was evaluated."""
    if out is not None:
        return Path(out)
    p = Path(model_name)
    return p if p.is_dir() and RunDir(p).is_run() else None
