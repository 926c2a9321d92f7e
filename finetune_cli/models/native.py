"""The architecture's own sequence-classification head (``*ForSequenceClassification``).

A classifier trained with ``model.head: native`` *is* a transformers model: its forward pass is the
transformers class's forward, so the saved folder loads with ``AutoModelForSequenceClassification``
and ``pipeline("text-classification")`` and computes exactly the function the tool evaluated.

Two things need to know the head's layout, and this module is the one place that does:

* Core-tuning mixes the classifier's *input* features and classifies the mixtures, so it needs the
  head as a function of the first-token state (:func:`head_from_first_token`). Known families:
  BERT-like (pooler → dropout → linear: BERT, MiniLM, ELECTRA-less BERT variants) and RoBERTa-like
  (dense → tanh → dropout → out_proj, as in RoBERTa, XLM-R, CamemBERT).
* R4F spectrally normalises the head's final linear map (:func:`final_linear`); at save the
  normalisation is folded into a plain weight (:func:`folded_state_dict`), so the saved folder
  is the evaluated function with no custom code.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from finetune_cli.errors import ModelError

SN_KEY = "parametrizations.weight"


def head_family(hf: nn.Module) -> Optional[str]:
    """``"bert"`` (pooler → dropout → classifier), ``"roberta"`` (classifier(dense, out_proj) on the
    sequence), or None for a head this module does not know."""
    head = getattr(hf, "classifier", None)
    if isinstance(head, nn.Linear) and isinstance(getattr(hf, "dropout", None), nn.Dropout) \
            and getattr(hf.base_model, "pooler", None) is not None:
        return "bert"
    if head is not None and isinstance(getattr(head, "dense", None), nn.Linear) \
            and isinstance(getattr(head, "out_proj", None), nn.Linear):
        return "roberta"
    return None


def head_module_names(hf: nn.Module) -> list[str]:
    """The modules of the native head, named as in ``hf.named_modules()``: every child of ``hf`` with
    weights beside the encoder, and the encoder's pooler where the head reads it (BERT-like). What
    LoRA trains in full and saves as peft's ``modules_to_save``."""
    base = hf.base_model_prefix
    names = [n for n, m in hf.named_children() if n != base and any(True for _ in m.parameters())]
    return [f"{base}.pooler", *names] if head_family(hf) == "bert" else names


def _unknown(hf: nn.Module, what: str) -> ModelError:
    return ModelError(f"{what} needs to know the classification head of {type(hf).__name__}, which finetune "
                      f"supports for BERT-like and RoBERTa-like models only; set model.head=pooled")


def final_linear(hf: nn.Module) -> nn.Linear:
    """The head's last linear map (the one R4F spectrally normalises)."""
    fam = head_family(hf)
    if fam == "bert":
        return hf.classifier
    if fam == "roberta":
        return hf.classifier.out_proj
    raise _unknown(hf, "a spectrally-normalised head (r4f)")


def head_from_first_token(hf: nn.Module, h0: torch.Tensor) -> torch.Tensor:
    """Logits of the native head applied to first-token states ``h0`` (N, hidden): the same
    computation as the transformers forward after the encoder."""
    fam = head_family(hf)
    seq = h0.unsqueeze(1)
    if fam == "bert":
        return hf.classifier(hf.dropout(hf.base_model.pooler(seq)))
    if fam == "roberta":
        return hf.classifier(seq)
    raise _unknown(hf, "classifying mixed features (core_tuning)")


def add_spectral_norm(hf: nn.Module) -> None:
    lin = final_linear(hf)
    if not nn.utils.parametrize.is_parametrized(lin, "weight"):
        nn.utils.parametrizations.spectral_norm(lin)


def eval_weight(lin: nn.Linear) -> torch.Tensor:
    """The weight a (spectrally normalised) linear map applies in eval mode: W / σ from the stored
    power-iteration vectors, read without updating them (no side effect)."""
    was = lin.training
    lin.eval()
    with torch.no_grad():
        w = lin.weight.detach().cpu().clone().contiguous()
    lin.train(was)
    return w


def folded_state_dict(hf: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``(plain, extra)``: the transformers state dict with any spectral-norm parametrisation folded
    into a plain ``weight`` (the weight the model uses in eval mode: W / σ with the stored power-
    iteration vectors), and the parametrisation's own tensors (``original``, ``_u``, ``_v``), which a
    resumed R4F run needs to continue exactly."""
    state = hf.state_dict()
    plain: dict[str, torch.Tensor] = {}
    extra: dict[str, torch.Tensor] = {}
    for k, v in state.items():
        if f".{SN_KEY}." in k:
            extra[k] = v.detach().cpu().contiguous()
        else:
            plain[k] = v.detach().cpu().contiguous()
    if extra:
        w = eval_weight(final_linear(hf))
        prefix = next(k for k in extra if k.endswith(".original")).split(f".{SN_KEY}.")[0]
        plain[f"{prefix}.weight"] = w
    return plain, extra
