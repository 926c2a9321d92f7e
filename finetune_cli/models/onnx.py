"""ONNX export (torch's exporter, ``torch.onnx.export(dynamo=True)``) and the ONNX folder.

An ONNX folder is ``model.onnx`` beside the source folder's small files (``config.json`` with the
labels, the tokenizer, ``finetune_model.json``, a sentence-transformers folder's ``modules.json`` and
pooling config): finetune reads it as any model folder (labels, length, pooling) and runs the graph
in onnxruntime. The graph takes the tokenizer's tensors (``input_ids``, ``attention_mask`` and,
for BERT-like models, ``token_type_ids``; int64, batch and length dynamic) and returns ``logits``
(classifiers) and ``embeddings`` (the pooled sentence embedding, before any normalisation). An
embedding model's graph also returns ``last_hidden_state`` (the token embeddings), the output
optimum's ``ORTModelForFeatureExtraction`` reads, so ``SentenceTransformer(folder, backend="onnx")``
runs the same graph and applies the folder's own Pooling and Normalize modules.
"""

from __future__ import annotations

import contextlib
import io
import logging
import shutil
import warnings
from pathlib import Path

import torch
from torch import nn

from finetune_cli.errors import ModelError, error_text
from finetune_cli.models.text_model import HeadSpec, ModelOutput
from finetune_cli.rundir import ONNX_MODEL

ONNX_FILE = ONNX_MODEL
TOKEN_OUTPUT = "last_hidden_state"  # the name optimum's feature-extraction class (and so ST) reads
OPSET = 18
# Weights and adapters stay behind: the graph holds the weights (adapters folded in).
_LEFT_BEHIND = (".safetensors", ".bin", ".pt", ".onnx", "adapter_config.json", "README.md")


def require_onnx(what: str, *, exporter: bool = False):
    """``onnxruntime`` (and, to export, ``onnx`` + ``onnxscript``), or one line naming the extra."""
    names = ("onnxruntime", "onnx", "onnxscript") if exporter else ("onnxruntime",)
    for name in names:
        try:
            __import__(name)
        except ImportError:
            raise ModelError(f"{what} needs {name}, which is not installed: pip install 'finetune-cli[onnx]'") from None
    import onnxruntime

    return onnxruntime


def is_onnx_folder(path: str | Path) -> bool:
    return (Path(path) / ONNX_FILE).is_file()


class _Graph(nn.Module):
    """The function exported: tokenizer tensors in, ``(logits, embeddings)`` or, for an embedding
    model, ``(embeddings, last_hidden_state)`` out."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids=None):
        features = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            features["token_type_ids"] = token_type_ids
        if self.model.has_classifier:
            out = self.model(features)
            return out.logits, out.embeddings
        from finetune_cli.models.text_model import pool

        enc = self.model.encoder(**features)
        return pool(enc.last_hidden_state, attention_mask, self.model.spec.pooling,
                    getattr(enc, "pooler_output", None)), enc.last_hidden_state


def export_onnx(model, features: dict[str, torch.Tensor], out: Path) -> list[str]:
    """Write ``out/model.onnx`` for ``model`` (a ``TextModel`` in eval mode on the CPU) traced on the
    batch ``features``; returns the output names."""
    require_onnx("--format onnx", exporter=True)
    names = tuple(n for n in ("input_ids", "attention_mask", "token_type_ids") if n in features)
    outputs = ["logits", "embeddings"] if model.has_classifier else ["embeddings", TOKEN_OUTPUT]
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
    shapes = tuple({0: batch, 1: length} for _ in names)
    # The exporter's progress lines and its notes on absent optional packages (torchvision) are noise.
    with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings(), _quiet_logs():
        warnings.simplefilter("ignore")
        torch.onnx.export(_Graph(model).eval(), tuple(features[n] for n in names), str(out / ONNX_FILE),
                          input_names=list(names), output_names=outputs, dynamic_shapes=shapes, dynamo=True,
                          opset_version=OPSET, external_data=False, verbose=False)
    return outputs


@contextlib.contextmanager
def _quiet_logs():
    log = logging.getLogger("torch.onnx")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def copy_folder_files(src: Path, out: Path) -> None:
    """The source folder's small files (config, tokenizer, finetune's and sentence-transformers'
    JSON), without weights: what reading the ONNX folder needs beside the graph."""
    for p in Path(src).iterdir():
        if p.is_file() and not p.name.endswith(_LEFT_BEHIND):
            shutil.copy2(p, out / p.name)
        elif p.is_dir() and all(q.suffix == ".json" for q in p.iterdir()):  # 1_Pooling/, 2_Normalize/
            shutil.copytree(p, out / p.name, dirs_exist_ok=True)


class OnnxTextModel(nn.Module):
    """An ONNX folder run in onnxruntime, with :class:`TextModel`'s face for inference: ``spec``,
    ``config``, ``has_classifier`` and ``forward(features) -> ModelOutput`` (CPU tensors)."""

    def __init__(self, session, spec: HeadSpec, config):
        super().__init__()
        self.session, self.spec, self.config = session, spec, config
        self.inputs = [i.name for i in session.get_inputs()]
        self.outputs = [o.name for o in session.get_outputs()]

    @property
    def has_classifier(self) -> bool:
        return self.spec.num_labels > 0

    def forward(self, features: dict[str, torch.Tensor]) -> ModelOutput:
        feed = {n: features[n].detach().cpu().to(torch.int64).numpy() for n in self.inputs}
        res = dict(zip(self.outputs, self.session.run(None, feed), strict=True))
        logits = torch.from_numpy(res["logits"]) if "logits" in res else None
        return ModelOutput(embeddings=torch.from_numpy(res["embeddings"]), logits=logits)


def load_onnx_folder(path: str, device: torch.device, embedding: bool = False):
    """``(OnnxTextModel, tokenizer, path, STConfig | None)`` for the ONNX folder ``path``, read as
    :func:`~finetune_cli.models.loading.load_embedding_model` reads a model folder."""
    from finetune_cli.models.loading import (
        check_tokenizer_files,
        load_config,
        load_tokenizer,
        read_head_spec,
        spec_from_config,
    )
    from finetune_cli.models.st_folder import read_st_config

    for need, what in (("config.json", "its config (labels, sizes)"),):
        if not (Path(path) / need).is_file():
            raise ModelError(f"the ONNX folder {path} has no {need} ({what}); export it again, or copy it from "
                             f"the model folder it was exported from")
    check_tokenizer_files(path)
    config = load_config(path)
    st = read_st_config(path) if embedding else None
    spec = read_head_spec(path) or spec_from_config(config)
    if st is not None:
        spec = HeadSpec(pooling=st.pooling, num_labels=0)
    return load_onnx_model(path, device, spec, config), load_tokenizer(path), path, st


def load_onnx_model(path: str | Path, device: torch.device, spec: HeadSpec, config) -> OnnxTextModel:
    """The ONNX folder ``path`` in an onnxruntime session on ``device`` (CPU, or CUDA when
    onnxruntime has its CUDA provider)."""
    ort = require_onnx(f"the ONNX folder {path}")
    provider = "CUDAExecutionProvider" if device.type == "cuda" else "CPUExecutionProvider"
    if provider not in ort.get_available_providers():
        raise ModelError(f"the ONNX folder {path} runs on the CPU here: this onnxruntime has no {provider} "
                         f"(use --device cpu)")
    try:
        sess = ort.InferenceSession(str(Path(path) / ONNX_FILE), providers=[provider])
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own error types
        raise ModelError(f"cannot load the model in {path}: {ONNX_FILE}: {error_text(e, 160)}") from None
    model = OnnxTextModel(sess, spec, config)
    for need in ("embeddings", *(("logits",) if model.has_classifier else ())):
        if need not in model.outputs:
            kind = "a classifier" if need == "logits" else "a model"
            raise ModelError(f"the ONNX folder {path}: its config makes it {kind}, but {ONNX_FILE} computes "
                             f"{', '.join(model.outputs) or 'nothing'}, not `{need}`; export the model again")
    return model

