"""An encoder with pooling and optional heads: the one model every objective trains.

``TextModel(features)`` returns a :class:`ModelOutput` with the pooled sentence embedding, the
classification logits (when a classifier head exists) and the projection (when a projection head
exists). Objectives call the model themselves, so that R3F can add noise to the input embeddings
and SimCSE can encode a doubled batch; see ``objectives/base.py``.

Two kinds of classifier (``HeadSpec.head``):

* ``native`` (default): the backbone is the architecture's own ``*ForSequenceClassification``
  (BERT: pooler → dropout → linear; RoBERTa: dense → tanh → dropout → out_proj) and the logits are
  its forward pass, so the saved folder is a plain transformers classifier. ``embeddings`` (what
  SCL contrasts, what probes and t-SNE read) are still ``model.pooling`` over the last hidden
  states, and ``features`` (what Core-tuning mixes) are the first-token states the head reads.
* ``pooled``: ``model.pooling`` → dropout → linear on a bare encoder, a head transformers has no
  class for (see ``models/loading.py`` for how such folders are kept from loading wrongly); with
  ``HeadSpec.normalize`` the pooled embedding is L2-normalised before the dropout.
* ``labels``: prediction by similarity to the label texts. The same layout as a normalised pooled
  head (so it saves, loads and exports as one), but its weight is not trained: row ``c`` is the
  L2-normalised embedding of label ``c``'s text divided by ``HeadSpec.temperature``, and the bias
  is 0, so ``logits_c = cos(x, label_c) / τ``. While training, the model holds the tokenised label
  texts (:meth:`TextModel.set_label_texts`) and re-encodes them into the head each time it is put
  in eval mode (every evaluation, and before a save).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

POOLINGS = ("cls", "mean", "pooler", "max", "mean_sqrt_len_tokens")


def pool(last_hidden: torch.Tensor, attention_mask: torch.Tensor, how: str,
         pooler_output: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Pool token states into one vector per sequence.

    ``mean`` averages the non-padding tokens (sentence-transformers' default), ``cls`` takes the
    first token, ``pooler`` the encoder's own pooler (tanh(W·h_cls), as in BERT's NSP head).
    """
    if how == "cls":
        return last_hidden[:, 0]
    if how == "pooler":
        if pooler_output is None:
            raise ValueError("pooling `pooler` needs an encoder with a pooler layer (this one has none)")
        return pooler_output
    m = attention_mask.unsqueeze(-1).to(last_hidden.dtype)
    if how == "mean":
        return (last_hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
    if how == "max":  # sentence-transformers' max pooling (padding excluded)
        return last_hidden.masked_fill(m == 0, float("-inf")).max(1).values
    if how == "mean_sqrt_len_tokens":
        return (last_hidden * m).sum(1) / m.sum(1).clamp(min=1e-9).sqrt()
    raise ValueError(f"unknown pooling `{how}`; choose one of {', '.join(POOLINGS)}")


class ClassificationHead(nn.Module):
    """[L2-normalise →] dropout → linear. With ``spectral_norm`` the linear map is 1-Lipschitz (R4F).

    ``normalize`` puts the input on the unit sphere first: the geometry a contrastive term (SCL,
    Core-tuning, SimCSE) shapes, and what SetFit's logistic-regression head reads from a
    sentence-transformers body whose last module is ``Normalize``.
    """

    def __init__(self, hidden: int, num_labels: int, dropout: float, spectral_norm: bool = False,
                 normalize: bool = False):
        super().__init__()
        self.normalize = normalize
        self.dropout = nn.Dropout(dropout)
        self.out_proj = nn.Linear(hidden, num_labels)
        self.spectral_norm = spectral_norm
        if spectral_norm:
            self.out_proj = nn.utils.parametrizations.spectral_norm(self.out_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.normalize:
            x = nn.functional.normalize(x, dim=-1)
        return self.out_proj(self.dropout(x))


class ProjectionHead(nn.Module):
    """Linear → tanh, the MLP SimCSE puts over the [CLS] vector during training."""

    def __init__(self, hidden: int, out: Optional[int] = None):
        super().__init__()
        self.dense = nn.Linear(hidden, out or hidden)
        self.act = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


def set_encoder_dropout(encoder: nn.Module, p: float) -> None:
    """Set every dropout of the encoder to ``p`` and record it in its config (so a saved and
    reloaded encoder keeps it). SimCSE's dropout ablation uses p=0."""
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout"):
        if hasattr(encoder.config, name):
            setattr(encoder.config, name, p)
    for m in encoder.modules():
        if isinstance(m, nn.Dropout):
            m.p = p


def encoder_layers(encoder: nn.Module) -> nn.ModuleList:
    """The transformer blocks of an encoder, bottom to top: the longest ``ModuleList`` named
    ``layer``/``layers`` (BERT/RoBERTa/ELECTRA ``encoder.layer``, DistilBERT ``transformer.layer``)."""
    found = [m for name, m in encoder.named_modules()
             if isinstance(m, nn.ModuleList) and name.rsplit(".", 1)[-1] in ("layer", "layers")]
    if not found:
        raise ValueError(f"no list of transformer layers found in {type(encoder).__name__}")
    return max(found, key=len)


def parameter_counts(model: nn.Module) -> tuple[int, int]:
    """``(trainable, total)`` parameters."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def enable_gradient_checkpointing(model: nn.Module) -> None:
    """Recompute the encoder layers' activations in the backward pass (transformers' own
    ``activation_checkpointing_enable``, non-reentrant: the RNG state is replayed, so dropout masks
    and gradients are those of a plain backward pass). Raises ``ValueError`` for an encoder without it."""
    enc = getattr(model, "encoder", model)
    if not getattr(enc, "supports_gradient_checkpointing", False):
        raise ValueError(f"{type(enc).__name__} does not support gradient checkpointing")
    enc.activation_checkpointing_enable({"use_reentrant": False})


@torch.no_grad()
def reinit_top_layers(encoder: nn.Module, k: int) -> None:
    """Re-initialise the top ``k`` transformer layers (and BERT's pooler, when there is one) with
    BERT's initialisation: linear weights ~ N(0, initializer_range²), biases 0, LayerNorm 1 and 0.

    Zhang et al. 2021, "Revisiting Few-sample BERT Fine-tuning" (arXiv 2006.05987), section 5.2:
    the top layers are specialised to the pre-training task; starting them fresh helps few-sample
    fine-tuning of BERT-large. Uses torch's global RNG (the trainer has seeded it).
    """
    if k <= 0:
        return
    layers = encoder_layers(encoder)
    if k > len(layers):
        raise ValueError(f"reinit_layers {k} exceeds the encoder's {len(layers)} layers")
    std = float(getattr(encoder.config, "initializer_range", 0.02))
    modules = [m for layer in layers[len(layers) - k:] for m in layer.modules()]
    pooler = getattr(encoder, "pooler", None)
    if isinstance(pooler, nn.Module):
        modules += list(pooler.modules())
    for m in modules:
        if isinstance(m, nn.Linear):
            m.weight.normal_(0.0, std)
            if m.bias is not None:
                m.bias.zero_()
        elif isinstance(m, nn.LayerNorm):
            m.weight.fill_(1.0)
            m.bias.zero_()


@dataclass
class ModelOutput:
    embeddings: torch.Tensor
    logits: Optional[torch.Tensor] = None
    projection: Optional[torch.Tensor] = None
    features: Optional[torch.Tensor] = None  # the classifier's input (``TextModel.classify``)
    tokens: Optional[torch.Tensor] = None  # the last hidden states (token-level similarity)


@dataclass(frozen=True)
class HeadSpec:
    """What sits on top of the encoder; saved as ``finetune_model.json`` beside the weights."""

    pooling: str = "mean"
    num_labels: int = 0
    classifier_dropout: float = 0.1
    spectral_norm: bool = False
    projection: bool = False
    problem_type: str = "single_label_classification"
    head: str = "native"
    threshold: float = 0.5  # multi-label: a label is predicted when its sigmoid >= threshold
    # multi-label: one threshold per label, tuned on the last evaluation before the save (see
    # ``engine.evaluation``); used instead of ``threshold`` by eval and predict unless told otherwise
    thresholds: Optional[tuple[float, ...]] = None
    normalize: bool = False  # pooled head: L2-normalise the pooled embedding before dropout -> linear
    temperature: float = 1.0  # labels head: logits are cosine similarities to the label texts / temperature

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class TextModel(nn.Module):
    """Encoder + pooling + heads.

    Args:
        backbone: a bare encoder (``AutoModel``), or for ``spec.head == "native"`` with labels the
            ``AutoModelForSequenceClassification`` model whose head is the classifier.
        spec: what sits on top.
    """

    def __init__(self, backbone: nn.Module, spec: HeadSpec):
        super().__init__()
        self.spec = spec
        self.native = spec.num_labels > 0 and spec.head == "native"
        hidden = backbone.config.hidden_size
        # Registered first under ``encoder.`` so that the trainer's parameter groups (encoder lr vs
        # head lr) see the shared encoder parameters by that name; ``hf`` holds the same encoder
        # plus the native head. (``named_parameters``/``parameters`` de-duplicate; the state dict
        # of a TextModel is never saved as such: ``models/loading.py`` saves ``hf``.)
        self.encoder = backbone.base_model if self.native else backbone
        self.hf = backbone if self.native else None
        self.label_head = spec.num_labels > 0 and spec.head == "labels"
        self.classifier = (ClassificationHead(hidden, spec.num_labels, spec.classifier_dropout, spec.spectral_norm,
                                              spec.normalize)
                           if spec.num_labels > 0 and not self.native and not self.label_head else None)
        if self.label_head:
            # Set from the label texts, never by the optimizer: frozen, no dropout, no bias.
            self.classifier = ClassificationHead(hidden, spec.num_labels, 0.0, normalize=True)
            self.classifier.requires_grad_(False)
            with torch.no_grad():
                self.classifier.out_proj.bias.zero_()
        self.projection = ProjectionHead(hidden) if spec.projection else None
        self.label_pad_id = 0
        self._label_keys: tuple[str, ...] = ()

    def set_label_texts(self, features: dict[str, torch.Tensor], pad_id: int) -> None:
        """The tokenised label texts, row ``c`` = label ``c`` (``input_ids``, ``attention_mask``,
        optionally ``token_type_ids``), padded with ``pad_id``. Kept as buffers that are not saved:
        they move with the model; objectives that train on the label texts read them, and a labels
        head is encoded from them."""
        self.label_pad_id = int(pad_id)
        for k, v in features.items():
            self.register_buffer(f"_label_{k}", v, persistent=False)
        self._label_keys = tuple(features)

    def label_inputs(self) -> Optional[dict[str, torch.Tensor]]:
        """The tokenised label texts on the model's device, or None when none were set."""
        if not self._label_keys:
            return None
        return {k: getattr(self, f"_label_{k}") for k in self._label_keys}

    @torch.no_grad()
    def refresh_label_head(self) -> None:
        """A labels head set from the label texts as the model now encodes them (eval mode: no
        dropout, so no random numbers are drawn and a resumed run stays exact)."""
        feats = self.label_inputs()
        if not self.label_head or feats is None:
            return
        was = self.training
        super().train(False)
        try:
            z = self(feats).embeddings.float()
        finally:
            super().train(was)
        w = nn.functional.normalize(z, dim=-1) / self.spec.temperature
        self.classifier.out_proj.weight.copy_(w.to(self.classifier.out_proj.weight.dtype))

    def train(self, mode: bool = True):
        """``eval()`` re-encodes a labels head from the label texts when the model holds them, so
        every evaluation and every save sees the head the encoder now implies."""
        super().train(mode)
        if not mode and self.label_head and self._label_keys:
            self.refresh_label_head()
        return self

    @property
    def config(self):  # the HF config (id2label, label2id, problem_type, ...)
        return self.hf.config if self.hf is not None else self.encoder.config

    @property
    def num_labels(self) -> int:
        return self.spec.num_labels

    @property
    def has_classifier(self) -> bool:
        return self.spec.num_labels > 0

    def classify(self, features: torch.Tensor) -> torch.Tensor:
        """Logits from classifier-input features (``ModelOutput.features``), e.g. mixed ones."""
        if self.hf is not None:
            from finetune_cli.models.native import head_from_first_token

            return head_from_first_token(self.hf, features)
        if self.classifier is None:
            raise ValueError("this model has no classifier head")
        return self.classifier(features)

    def forward(self, features: dict[str, torch.Tensor], noise: Optional[tuple] = None,
                ) -> ModelOutput:
        """Encode one tokenised batch.

        Args:
            features: ``input_ids``, ``attention_mask`` and optionally ``token_type_ids``.
            noise: ``("uniform", eps)`` or ``("normal", eps)`` adds noise to the input token
                embeddings (before position/type embeddings are added), as R3F does.
                ``(kind, eps, k)`` leaves the first ``k`` rows clean, so R3F can encode a batch
                and its noisy copy in one pass.
        """
        kwargs = {k: v for k, v in features.items() if k in ("attention_mask", "token_type_ids")}
        if noise is None:
            inputs = {"input_ids": features["input_ids"]}
        else:
            kind, eps, *rest = noise
            start = int(rest[0]) if rest else 0
            emb = self.encoder.get_input_embeddings()(features["input_ids"])
            # Noisy rows start from detached embeddings, as the R3F reference code does (fairseq
            # ``token_embeddings.detach()``): they train the encoder layers and heads, not the
            # word-embedding table. Clean rows keep their gradient.
            noisy = emb[start:].detach()
            if kind == "uniform":
                noisy = noisy + torch.empty_like(noisy).uniform_(-eps, eps)
            else:
                noisy = noisy + torch.randn_like(noisy) * eps
            inputs = {"inputs_embeds": torch.cat([emb[:start], noisy]) if start else noisy}
        if self.hf is not None:
            # The transformers forward itself: the logits are what the saved folder computes.
            out = self.hf(**inputs, **kwargs, output_hidden_states=True)
            last = out.hidden_states[-1]
            pooler = None
            if self.spec.pooling == "pooler" and getattr(self.encoder, "pooler", None) is not None:
                pooler = self.encoder.pooler(last)
            pooled = pool(last, features["attention_mask"], self.spec.pooling, pooler)
            logits, feats, tokens = out.logits, last[:, 0], last
        else:
            out = self.encoder(**inputs, **kwargs)
            pooled = pool(out.last_hidden_state, features["attention_mask"], self.spec.pooling,
                          getattr(out, "pooler_output", None))
            logits = self.classifier(pooled) if self.classifier is not None else None
            feats, tokens = pooled, out.last_hidden_state
        proj = self.projection(pooled) if self.projection is not None else None
        return ModelOutput(embeddings=pooled, logits=logits, projection=proj, features=feats, tokens=tokens)
