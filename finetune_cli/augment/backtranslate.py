"""Back-translation with any pair of Hugging Face sequence-to-sequence translation models.

``source -> pivot -> source``: the forward model (e.g. Helsinki-NLP/opus-mt-en-de) writes ``N``
pivot sentences per input, the backward model (opus-mt-de-en) translates each pivot back. With a
temperature above 0 both directions sample (temperature-scaled, optionally top-k / top-p
truncated), which is how the SCL paper builds its noisy training sets: the higher the temperature,
the further the paraphrase drifts from the original. Temperature 0 means beam search (the usual,
least noisy back-translation; CERT uses it for augmentation).

Generation is batched and length-sorted: every text is tokenised once, texts of similar length go
into the same batch (so little padding is computed), and results are put back in input order.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Optional

import torch

from finetune_cli.augment import DEFAULT_BACKWARD, DEFAULT_FORWARD  # noqa: F401 (re-exported)
from finetune_cli.errors import ModelError, error_text


@dataclass(frozen=True)
class SamplingSpec:
    """How to decode. ``temperature == 0`` is beam search with ``num_beams`` beams."""

    temperature: float = 1.0
    top_k: int = 0  # 0 = no top-k truncation
    top_p: float = 1.0  # 1.0 = no nucleus truncation
    num_beams: int = 4
    max_length: int = 256  # input tokens kept, and the cap on generated tokens

    def generate_kwargs(self, num_return: int) -> dict:
        if self.temperature == 0:
            return {"do_sample": False, "num_beams": max(self.num_beams, num_return), "num_return_sequences": num_return}
        return {"do_sample": True, "num_beams": 1, "temperature": self.temperature, "top_k": self.top_k,
                "top_p": self.top_p, "num_return_sequences": num_return}


@dataclass
class Seq2Seq:
    """A translation model, its tokenizer and where it came from."""

    model: torch.nn.Module
    tokenizer: object
    path: str


def load_seq2seq(name: str, device: torch.device) -> Seq2Seq:
    """Load a seq2seq model + tokenizer from a local folder or a hub id; one-line ModelError otherwise."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from finetune_cli.models.loading import _hub_error, resolve_model

    hf_logging.disable_progress_bar()
    path, is_local = resolve_model(name)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Marian's "pip install sacremoses" recommendation
            tokenizer = AutoTokenizer.from_pretrained(path)
            model = AutoModelForSeq2SeqLM.from_pretrained(path)
    except ModelError:
        raise
    except ValueError as e:
        if "Unrecognized configuration class" in str(e):
            raise ModelError(f"model {name} is not a sequence-to-sequence (translation) model") from None
        if not is_local:
            raise _hub_error(name, e) from None
        raise ModelError(f"cannot load translation model from {path}: {error_text(e, 200)}") from None
    except Exception as e:  # noqa: BLE001 - a broken local folder raises many types (OSError, JSON, safetensors…)
        if not is_local:
            raise _hub_error(name, e) from None
        raise ModelError(f"cannot load translation model from {path}: {type(e).__name__}: "
                         f"{error_text(e, 200)}") from None
    if getattr(tokenizer, "pad_token_id", None) is None:
        raise ModelError(f"tokenizer of {path} has no padding token; batched generation needs one")
    model.eval().to(device)
    return Seq2Seq(model, tokenizer, path)


def generate(m: Seq2Seq, texts: Sequence[str], spec: SamplingSpec, num_return: int = 1, batch_size: int = 32,
             progress: Optional[Callable[[int], None]] = None) -> list[list[str]]:
    """Translate ``texts``; returns ``num_return`` outputs per text, in input order.

    Empty texts are not sent to the model; they come back as empty strings.
    """
    out: list[list[str]] = [[""] * num_return for _ in texts]
    todo = [i for i, t in enumerate(texts) if t.strip()]
    if not todo:
        return out
    tok = m.tokenizer
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ids = tok([texts[i] for i in todo], truncation=True, max_length=spec.max_length)["input_ids"]
    # Longest first: the biggest batch is met at the start, so a memory problem shows at once.
    order = sorted(range(len(todo)), key=lambda j: -len(ids[j]))
    device = next(m.model.parameters()).device
    kwargs = spec.generate_kwargs(num_return)
    for s in range(0, len(order), batch_size):
        batch = order[s:s + batch_size]
        feats = tok.pad({"input_ids": [ids[j] for j in batch]}, return_tensors="pt")
        feats = {k: v.to(device) for k, v in feats.items()}
        # A fixed cap (not one from the batch's longest input), so that which sentences share a batch
        # never changes what a deterministic decode writes for one of them.
        with torch.inference_mode():
            gen = m.model.generate(**feats, **kwargs, max_new_tokens=spec.max_length)
        decoded = tok.batch_decode(gen, skip_special_tokens=True)
        for b, j in enumerate(batch):
            out[todo[j]] = [" ".join(d.split()) for d in decoded[b * num_return:(b + 1) * num_return]]
        if progress is not None:
            progress(len(batch))
    return out


class BackTranslator:
    """``source -> pivot -> source`` with two seq2seq models."""

    def __init__(self, forward: Seq2Seq, backward: Seq2Seq, spec: SamplingSpec, batch_size: int = 32):
        self.forward, self.backward, self.spec, self.batch_size = forward, backward, spec, batch_size

    @classmethod
    def load(cls, forward: str, backward: str, spec: SamplingSpec, device: torch.device,
             batch_size: int = 32) -> BackTranslator:
        return cls(load_seq2seq(forward, device), load_seq2seq(backward, device), spec, batch_size)

    def __call__(self, texts: Sequence[str], num_return: int = 1, seed: Optional[int] = None,
                 progress: Optional[Callable[[int], None]] = None) -> list[list[str]]:
        """``num_return`` paraphrases per text: ``num_return`` pivots, each translated back once.

        With ``seed`` the global torch RNG is reset first, so the same texts, settings and seed give
        the same output (on the same device and batch size).
        """
        if seed is not None:
            torch.manual_seed(seed)
        pivots = generate(self.forward, texts, self.spec, num_return, self.batch_size, progress)
        flat = [p for ps in pivots for p in ps]
        back = generate(self.backward, flat, self.spec, 1, self.batch_size, progress)
        return [[back[i * num_return + r][0] for r in range(num_return)] for i in range(len(texts))]
