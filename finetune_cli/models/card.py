"""Model cards: the ``README.md`` every saved model folder gets, in Hugging Face model-card form
(YAML front matter read by the hub, then what was trained, on what, how, how well, and how to load
it without finetune)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

EMBEDDED_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"
_TMP = re.compile(r"^\.(.+)\.[^.]+\.tmp$")  # fsutil.atomic_dir's temporary sibling of `<name>`


def display_path(out: Path) -> str:
    """The folder's final path: ``atomic_dir`` writes into ``.<name>.<random>.tmp`` first."""
    parts = [(_TMP.match(p).group(1) if _TMP.match(p) else p) for p in Path(out).parts]  # type: ignore[union-attr]
    return str(Path(*parts))


def _base_model(name: str) -> str:
    return EMBEDDED_HUB_ID if name == "embedded" else name


def _fmt(v: Any) -> str:
    return f"{v:.4f}" if isinstance(v, float) else str(v)


def _snippet(kind: str, path: str, problem: str, normalize: bool = False) -> str:
    if kind == "embedding":
        return (f"```python\nfrom sentence_transformers import SentenceTransformer\n\n"
                f"model = SentenceTransformer({path!r})\nemb = model.encode([\"A sentence.\", \"Another one.\"])\n```\n\n"
                f"or `finetune embed {path} --input sentences.txt --output emb.npy`.\n")
    if kind == "pooled":
        head = "`model.pooling` → L2-normalise → linear" if normalize else "`model.pooling` + linear"
        return (f"This head ({head}) has no transformers class, so the folder is marked with "
                "`model_type: finetune-pooled-classifier` and transformers refuses to load it (rather than "
                "load it with a random head). Load it with finetune:\n\n"
                f"```python\nfrom finetune_cli.models import load_text_model\n\n"
                f"model, tokenizer, _ = load_text_model({path!r})\nmodel.eval()\n"
                f"logits = model(dict(tokenizer([\"A sentence.\"], return_tensors=\"pt\"))).logits\n```\n\n"
                f"or `finetune predict {path} --input data.csv --output predictions.csv`. "
                f"Retrain with `model.head=native` for a folder transformers loads as is.\n")
    extra = {"regression": ', function_to_apply="none"', "multi_label_classification": ", top_k=None"}.get(problem, "")
    return (f"```python\nfrom transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline\n\n"
            f"clf = pipeline(\"text-classification\", model={path!r}{extra})\nprint(clf(\"A sentence.\"))\n\n"
            f"# or the model itself\nmodel = AutoModelForSequenceClassification.from_pretrained({path!r})\n"
            f"tokenizer = AutoTokenizer.from_pretrained({path!r})\n```\n\n"
            f"or `finetune predict {path} --input data.csv --output predictions.csv`.\n")


def render_model_card(out: Path, model, info: dict[str, Any]) -> str:
    """The card's text. ``info`` comes from the training pipeline: ``recipe`` (plain dict),
    ``objective``, ``params``, ``summary``, ``paper``, ``train_examples``, ``eval_examples``,
    ``labels``, ``step``, ``eval`` (metrics of the latest evaluation), ``metric``, ``best_metric``,
    ``best_step``."""
    spec = model.spec
    kind = "embedding" if not model.has_classifier else ("native" if model.hf is not None else "pooled")
    recipe = info.get("recipe", {})
    m, d, t = recipe.get("model", {}), recipe.get("data", {}), recipe.get("train", {})
    path = display_path(out)
    datasets = [str(d["dataset"]).split(":")[0].split("/")[0]] if d.get("dataset") else []
    evals = info.get("eval") or {}
    objective = info.get("objective", "?")
    front = {
        "base_model": _base_model(str(m.get("name", "?"))),
        "library_name": {"embedding": "sentence-transformers", "native": "transformers"}.get(kind, "finetune"),
        "pipeline_tag": "sentence-similarity" if kind == "embedding" else "text-classification",
        "tags": ["finetune", objective] + (["sentence-transformers"] if kind == "embedding" else [])
        + ([spec.problem_type.replace("_", "-")] if model.has_classifier else []),
        "datasets": datasets,
        "metrics": list(evals),
    }
    lines = ["---", yaml.safe_dump(front, sort_keys=False).rstrip(), "---", "",
             f"# {path}", "",
             f"Fine-tuned from `{front['base_model']}` with finetune, objective `{objective}`"
             + (f": {info['summary']}" if info.get("summary") else "."), ""]
    lines += ["## Objective", "", f"`{objective}`" + (f" — {info['paper']}" if info.get("paper") else ""), ""]
    params = info.get("params") or {}
    if params:
        lines += ["| hyper-parameter | value |", "|---|---|"] + [f"| `{k}` | {v} |" for k, v in params.items()] + [""]
    if model.has_classifier:
        head = ("the architecture's own sequence-classification head (`*ForSequenceClassification`)"
                if kind == "native" else f"`{spec.pooling}` pooling + dropout + linear")
        lines += [f"Head: {head}; problem type `{spec.problem_type}`"
                  + (f" (threshold {spec.threshold})" if spec.problem_type == "multi_label_classification" else "")
                  + (f"; labels: {', '.join(map(str, info['labels']))}" if info.get("labels") else "") + ".", ""]
    src = d.get("dataset") or ", ".join(f"{k}: `{d[k]}`" for k in ("train", "eval") if d.get(k))
    lines += ["## Data", "", f"- source: {src or '?'}",
              f"- training examples: {info.get('train_examples', '?')}"
              + (f" ({d['few_shot']} per class)" if d.get("few_shot") else ""),
              f"- evaluation examples: {info.get('eval_examples', 0)}", ""]
    sched = {k: t.get(k) for k in ("epochs", "max_steps", "batch_size", "grad_accum", "lr", "head_lr", "weight_decay",
                                   "warmup_ratio", "precision", "seed") if t.get(k) is not None}
    sched["max_length"] = m.get("max_length")
    lines += ["## Training", "", f"Steps done when this folder was written: {info.get('step', '?')}.", "",
              "| setting | value |", "|---|---|"] + [f"| `{k}` | {v} |" for k, v in sched.items()] + [""]
    lines += ["## Evaluation", ""]
    if evals:
        lines += [f"Latest evaluation during training ({info.get('eval_examples', '?')} examples):", "",
                  "| metric | value |", "|---|---|"]
        lines += [f"| {k} | {_fmt(v)} |" for k, v in evals.items()] + [""]
        if info.get("best_step") is not None:
            lines += [f"Best `{info.get('metric')}` during training: {_fmt(info.get('best_metric'))} at step "
                      f"{info['best_step']} (the run's `best/` folder).", ""]
    else:
        lines += ["No evaluation had run when this folder was written.", ""]
    lines += ["## Use it", "", _snippet(kind, path, spec.problem_type, spec.normalize)]
    return "\n".join(lines)


def write_model_card(out: Path, model, info: dict[str, Any]) -> None:
    (Path(out) / "README.md").write_text(render_model_card(Path(out), model, info), encoding="utf-8")
