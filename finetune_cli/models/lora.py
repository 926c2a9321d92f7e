"""Low-rank adapters (LoRA) through ``peft``'s functional API, and the peft adapter folder.

The adapters are injected into the model in place (``peft.functional.inject_adapter_in_model``),
so a LoRA model is the same :class:`TextModel` as any other (same ``hf``/``encoder`` modules, same
head code in ``native.py``): the encoder's own weights are frozen, the adapters and the head train.

A saved LoRA model is a peft adapter folder that ``PeftModel.from_pretrained`` and
``AutoPeftModelForSequenceClassification`` load: ``adapter_config.json`` (the base model's path or
hub id, the rank, the target modules, and the native head as ``modules_to_save``) and
``adapter_model.safetensors`` (keys as peft writes them: ``base_model.model.<module>``; the adapter
name dropped), beside finetune's usual ``config.json`` (labels, problem type), tokenizer and
``finetune_model.json``. A pooled head or a projection stays in ``finetune_head.safetensors``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from torch import nn

from finetune_cli.errors import ModelError, error_text
from finetune_cli.rundir import ADAPTER_CONFIG

ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # how peft names the wrapped model's modules in its files
ADAPTER = "default"  # peft's adapter name (dropped from the keys in the file)


def require_peft(what: str):
    """``peft``, or a one-line error naming the extra that installs it."""
    try:
        import peft.functional
    except ImportError:
        raise ModelError(f"{what} needs peft, which is not installed: pip install 'finetune-cli[lora]'") from None
    return peft


def adapter_target(model) -> nn.Module:
    """The module the adapters are injected into: the native classifier (so adapter and head keys
    are those of ``AutoModelForSequenceClassification``), else the bare encoder."""
    hf = getattr(model, "hf", None)
    return hf if hf is not None else getattr(model, "encoder", model)


def lora_config(model) -> Optional[Any]:
    """The model's peft ``LoraConfig``, or None for a model without adapters."""
    return (getattr(adapter_target(model), "peft_config", None) or {}).get(ADAPTER)


def is_adapter_folder(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def add_lora(model, r: int, alpha: float, dropout: float, target_modules: Optional[list[str]], base: str,
             revision: Optional[str] = None) -> None:
    """Inject fresh adapters (peft's initialisation: A random, B zero, so the model's function is
    unchanged) and leave trainable only them and the heads. ``base``: the path or hub id the
    frozen weights come from, recorded in the adapter folder."""
    peft = require_peft("model.lora")
    from finetune_cli.models.native import head_module_names

    target = adapter_target(model)
    heads = head_module_names(target) if model.hf is not None else None
    cfg = peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=target_modules,
                          task_type="SEQ_CLS" if heads else "FEATURE_EXTRACTION",
                          base_model_name_or_path=base, revision=revision)
    _inject(peft, cfg, target)
    # Recorded after the injection: peft would wrap these modules itself, and native.py reads them as is.
    cfg.modules_to_save = heads
    for name in heads or ():
        target.get_submodule(name).requires_grad_(True)


def _inject(peft, cfg, target: nn.Module) -> None:
    try:
        peft.functional.inject_adapter_in_model(cfg, target, adapter_name=ADAPTER)
    except ValueError as e:  # no target_modules default for the architecture, or a name that matches nothing
        raise ModelError(f"model.lora: {error_text(e, 240)}") from None


def adapter_state(model, plain: Optional[dict] = None) -> dict:
    """The adapter file's tensors: the adapters, and the native head's weights from ``plain`` (a
    state dict of ``hf``, spectral norm folded), named as peft names them."""
    peft = require_peft("a LoRA model")
    target = adapter_target(model)
    state = dict(peft.functional.get_peft_model_state_dict(target, adapter_name=ADAPTER))
    heads = lora_config(model).modules_to_save or ()
    state.update({k: v for k, v in (plain or {}).items() if any(k.startswith(f"{h}.") for h in heads)})
    return {PEFT_PREFIX + k: v.detach().cpu().contiguous() for k, v in state.items()}


def save_adapter(model, out: Path, plain: Optional[dict] = None) -> None:
    """``adapter_config.json`` + ``adapter_model.safetensors`` (+ ``config.json`` for a classifier) in ``out``."""
    from safetensors.torch import save_file

    target = adapter_target(model)
    save_file(adapter_state(model, plain), str(out / ADAPTER_WEIGHTS))
    lora_config(model).save_pretrained(str(out))
    if model.has_classifier:  # the labels; an embedding folder has none, so that transformers and
        # sentence-transformers take the base's config from the adapter (a config.json here would
        # make them look for the full weights here)
        target.config.architectures = [type(target).__name__]
        target.config.save_pretrained(out)


def read_adapter_config(path: str | Path):
    """The folder's peft ``LoraConfig`` (one line naming the file when it cannot be read)."""
    peft = require_peft(f"the LoRA adapter folder {path}")
    try:
        cfg = peft.PeftConfig.from_pretrained(str(path))
    except (OSError, ValueError, TypeError) as e:
        raise ModelError(f"cannot load the model in {path}: {ADAPTER_CONFIG}: {error_text(e, 160)}") from None
    if type(cfg).__name__ != "LoraConfig" or not cfg.base_model_name_or_path:
        raise ModelError(f"cannot load the model in {path}: {ADAPTER_CONFIG} is not a LoRA adapter with a "
                         f"base_model_name_or_path (finetune loads LoRA adapters only)")
    return cfg


def load_adapter(model, path: str | Path, cfg) -> None:
    """Inject the adapters of the folder ``path`` into ``model`` (built on the base weights) and load
    them and the native head; trainable as when they were saved (a checkpoint resumes)."""
    from safetensors.torch import load_file

    heads = cfg.modules_to_save
    add_lora(model, cfg.r, cfg.lora_alpha, cfg.lora_dropout, _as_list(cfg.target_modules),
             cfg.base_model_name_or_path, cfg.revision)
    try:
        state = load_file(str(Path(path) / ADAPTER_WEIGHTS))
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
        raise ModelError(f"cannot load the model in {path}: {ADAPTER_WEIGHTS} cannot be read "
                         f"({error_text(e, 120)})") from None
    state = {k.removeprefix(PEFT_PREFIX): v for k, v in state.items()}
    target = adapter_target(model)
    if model.hf is None and heads:  # a classifier's adapters read as a bare encoder: its keys lose the prefix
        pre = f"{getattr(model.encoder, 'base_model_prefix', '')}."
        state = {k.removeprefix(pre): v for k, v in state.items() if k.startswith(pre)}
    is_head = [k for k in state if model.hf is not None and any(k.startswith(f"{h}.") for h in heads or ())]
    peft = require_peft("a LoRA model")
    try:
        target.load_state_dict({k: state.pop(k) for k in is_head}, strict=False)
        missing = peft.functional.set_peft_model_state_dict(target, state, adapter_name=ADAPTER)
    except RuntimeError as e:  # shapes of another rank or model: torch's "size mismatch for …"
        why = error_text(e, 400)
        first = why.split("size mismatch for ", 1)[-1].split(". ")[0][:160] if "size mismatch" in why else why[:160]
        raise ModelError(f"cannot load the model in {path}: {ADAPTER_WEIGHTS} does not match {ADAPTER_CONFIG} or its "
                         f"base model ({first}); the files come from different adapters") from None
    lost = [k for k in getattr(missing, "unexpected_keys", []) if "lora_" in k]
    if lost:
        raise ModelError(f"cannot load the model in {path}: {ADAPTER_WEIGHTS} holds adapters the model has no "
                         f"layer for ({lost[0]})")


def _as_list(modules: Any) -> Optional[list[str]]:
    return sorted(modules) if isinstance(modules, (set, list, tuple)) else modules


def merge_lora(model) -> None:
    """Fold every adapter into its layer's weight (W + scale·B·A) and put the plain layer back: the
    model is then an ordinary transformers model, with the same function (to float rounding)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    target = adapter_target(model)
    for name, m in list(target.named_modules()):
        if isinstance(m, BaseTunerLayer):
            m.merge()
            parent, _, child = name.rpartition(".")
            setattr(target.get_submodule(parent), child, m.get_base_layer())
    target.__dict__.pop("peft_config", None)
