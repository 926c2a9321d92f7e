"""The objective interface.

An objective is a small ``nn.Module`` whose constructor takes only hyper-parameters. It computes
the loss for one batch: ``forward(model, batch) -> {"loss": total, <part>: value, ...}``. The
named parts are logged separately in ``metrics.jsonl``.

Why ``forward`` takes the model rather than its outputs (DESIGN.md said ``model_outputs``): R3F
must run the encoder a second time with noise on the input embeddings and SimCSE encodes a doubled
batch, so a loop that ran the model once for every objective would have to know which objective it
is running — the switch STYLE.md forbids. The model is called only inside objectives; the engine
never looks at a model output.

The data contract is declared as class attributes, read by the pipelines and the recipe validator:

* ``required_columns``: logical columns the data must provide (``text``, ``text_pair``, ``label``…)
* ``label_type``: ``"class"``, ``"float"`` or ``None`` (unlabeled)
* ``problem_types``: the ``model.problem_type`` values the objective trains (transformers'
  ``single_label_classification``, ``regression``, ``multi_label_classification``); for the last
  two the labels are float scores / multi-hot rows whatever ``label_type`` says
* ``min_classes``: the fewest distinct labels the objective is defined for
* ``needs_classifier`` / ``needs_projection`` / ``spectral_norm_head``: which heads the model needs
* ``sampler``: name of the batch sampler in ``data.sampling.SAMPLERS``
* ``encoding``: ``"joint"`` (text and text_pair in one sequence, the cross-encoder) or
  ``"separate"`` (each text column encoded on its own, for bi-encoders)
* ``label_texts``: the objective encodes the label texts (names, or ``data.label_descriptions``)
  beside the batch: the pipeline tokenises them and hands them to the model
  (``TextModel.set_label_texts``); only such objectives train a ``model.head: labels``
* ``parts``: names of the loss components returned besides ``loss``
* ``capturable``: its loss reads no value on the host and makes no shape from data, so a training
  step with it can be captured as a CUDA graph (``train.cuda_graphs``); an instance whose settings
  break that says why in :meth:`Objective.capture_refusal`
* ``evaluation``: how the pipeline evaluates during training, a key of
  ``pipelines.common.EVALUATORS`` (``"classifier"``: the head's logits on labelled data;
  ``"similarity"``: Spearman of embedding cosines against gold pair scores)
"""

from __future__ import annotations

import inspect
import re
from typing import Any, ClassVar, Optional

import torch
from torch import nn

from finetune_cli.metrics.tasks import LABEL_TYPES


class Objective(nn.Module):
    name: ClassVar[str] = ""
    required_columns: ClassVar[tuple[str, ...]] = ("text", "label")
    label_type: ClassVar[Optional[str]] = "class"
    problem_types: ClassVar[tuple[str, ...]] = ("single_label_classification",)
    min_classes: ClassVar[int] = 2
    needs_classifier: ClassVar[bool] = True
    needs_projection: ClassVar[bool] = False
    spectral_norm_head: ClassVar[bool] = False
    sampler: ClassVar[str] = "length_grouped"
    encoding: ClassVar[str] = "joint"
    label_texts: ClassVar[bool] = False
    capturable: ClassVar[bool] = False
    not_capturable: ClassVar[str] = "its loss reads values on the host or makes shapes from data"
    parts: ClassVar[tuple[str, ...]] = ()
    evaluation: ClassVar[str] = "classifier"

    def bind_labels(self, labels: Any, num_labels: int) -> None:
        """Called once with the training labels (as encoded) and the label count before training,
        for hyper-parameters that depend on the data (``ce``'s ``class_weights: balanced``); a bad
        combination is a :class:`~finetune_cli.errors.RecipeError` here, before any step runs."""

    def capture_refusal(self) -> Optional[str]:
        """Why a training step with this objective, as configured, cannot be captured as a CUDA graph
        (None: it can). The class's ``capturable``; objectives whose settings matter override it."""
        return None if self.capturable else f"objective `{self.name}`: {self.not_capturable}"

    def forward(self, model: nn.Module, batch: dict[str, Any]) -> dict[str, Any]:  # pragma: no cover
        raise NotImplementedError

    @classmethod
    def describe(cls, problem_type: Optional[str] = None) -> dict[str, Any]:
        """What a model card says about the loss trained for ``problem_type``: ``loss`` (one line),
        ``paper`` (authors, title, venue, arXiv id), ``arxiv`` (the id) and ``unused`` (parameters
        this loss does not read), from the class
        docstring's summary paragraph and its ``Paper:`` paragraph. An objective whose loss depends on the
        problem type (``ce``: MSE for regression) overrides this, in its own file."""
        doc = inspect.cleandoc(cls.__doc__ or "")
        para = " ".join(doc.split("Paper:", 1)[1].split("\n\n")[0].split()) if "Paper:" in doc else ""
        m = re.search(r"arXiv (\d{4}\.\d{4,5})\)?", para)
        return {"loss": " ".join(doc.split("\n\n")[0].split()) or cls.name, "paper": (para[:m.end()] if m else para) or None,
                "arxiv": m.group(1) if m else None, "unused": ()}

    @classmethod
    def label_type_for(cls, problem_type: Optional[str]) -> Optional[str]:
        """How labels are read: the problem type's kind (``float`` for regression, ``multi`` for
        multi-label) for an objective with a classifier, else the objective's own label type."""
        if cls.needs_classifier and problem_type in ("regression", "multi_label_classification"):
            return LABEL_TYPES[problem_type]
        return cls.label_type


def check_range(name: str, value: float, *, gt: Optional[float] = None, ge: Optional[float] = None,
                lt: Optional[float] = None, le: Optional[float] = None) -> None:
    """Raise ``ValueError("<name> must be ...")`` when ``value`` is outside the bounds."""
    if gt is not None and not value > gt:
        raise ValueError(f"{name} must be > {gt}, got {value}")
    if ge is not None and not value >= ge:
        raise ValueError(f"{name} must be >= {ge}, got {value}")
    if lt is not None and not value < lt:
        raise ValueError(f"{name} must be < {lt}, got {value}")
    if le is not None and not value <= le:
        raise ValueError(f"{name} must be <= {le}, got {value}")


def repeat_rows(features: dict[str, torch.Tensor], k: int) -> dict[str, torch.Tensor]:
    """The tokenised batch stacked ``k`` times (rows ``i, n+i, 2n+i …`` are the same text). Encoded in
    one forward pass in training mode, each copy gets its own dropout masks: SimCSE's augmentation."""
    return {name: torch.cat([v] * k, dim=0) for name, v in features.items()}


def crop_rows(features: dict[str, torch.Tensor], keep: torch.Tensor, starts: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each row cut to a contiguous span of its text: ``[first] text[s : s+k] [last]``.

    A row's text is the tokens between its first token (``[CLS]``/``<s>``) and its last unmasked
    one (``[SEP]``/``</s>``); ``keep[i]`` of them are kept from ``starts[i]`` on, then the last
    token, then masked positions. The width stays the batch's, so a cropped copy stacks with the
    whole one. Single texts only: a joint pair would lose its separator (the caller checks).
    """
    ids, mask = features["input_ids"], features["attention_mask"]
    n, width = ids.shape
    lengths = mask.sum(1)
    j = torch.arange(width, device=ids.device).expand(n, width)
    k, s = keep.view(-1, 1).to(ids.device), starts.view(-1, 1).to(ids.device)
    # source position of each output position: 0 -> 0; 1..k -> 1+s..s+k; k+1 -> the last token; after: itself
    src = torch.where(j == 0, 0, torch.where(j <= k, j + s, torch.where(j == k + 1, lengths.view(-1, 1) - 1, j)))
    out = {name: v.gather(1, src) if v.dim() == 2 and v.shape == ids.shape else v for name, v in features.items()}
    out["attention_mask"] = (j <= k + 1).to(mask.dtype)
    return out


def trim_padding(features: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The batch cut to its longest row: columns that only padding fills cost compute and change nothing."""
    width = int(features["attention_mask"].sum(1).max())
    w = features["input_ids"].shape[1]
    return {name: v[:, :width] if v.dim() == 2 and v.shape[1] == w else v for name, v in features.items()}


def sample_crops(lengths: torch.Tensor, low: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(keep, starts)`` for :func:`crop_rows`: row ``i`` keeps ``max(1, round(u·m))`` of its ``m =
    lengths[i] - 2`` text tokens, ``u ~ U(low, 1)``, from a uniform start (torch's global RNG, so the
    trainer's seed and resume state govern it)."""
    m = (lengths - 2).clamp(min=1)
    u = low + (1.0 - low) * torch.rand(m.shape, device=m.device)
    keep = torch.minimum((u * m).round().long().clamp(min=1), m)
    starts = (torch.rand(m.shape, device=m.device) * (m - keep + 1)).floor().long()
    return keep, starts
