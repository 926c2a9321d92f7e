"""``finetune export``: a model folder, as another kind of folder.

- ``--merge``: a LoRA adapter folder -> a plain transformers (or sentence-transformers) folder, the
  adapters folded into the weights (the same logits, to float rounding).
- ``--format onnx``: any classifier or embedding model (a LoRA one merged first) -> an ONNX folder
  (``models/onnx.py``) that ``predict``, ``eval`` and ``embed`` run in onnxruntime.

The model is loaded through the inference session, as ``predict`` loads it; the output folder is
checked first by the rule every command's output folder goes through (``fsutil.check_writable_dir``),
then written aside and renamed into place (an interrupted export leaves it empty or as it was).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from finetune_cli.engine.inference import open_session
from finetune_cli.errors import ModelError, OutputError, RunDirError
from finetune_cli.fsutil import atomic_dir, check_apart, check_writable_dir, public_files
from finetune_cli.inputs import model_inputs
from finetune_cli.models.exporters import exported_as, exporter
from finetune_cli.models.loading import describe_model
from finetune_cli.models.lora import is_adapter_folder


@dataclass
class ExportResult:
    model: str
    output: str
    format: str
    merged: bool  # LoRA adapters folded into the weights
    outputs: list[str]  # what the model computes: logits and/or embeddings
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _check_output(model_name: str, output: str, overwrite: bool) -> Path:
    """The output is apart from what the export reads (it is replaced whole), empty unless
    ``overwrite``, and its parent writable. It is not created here: a failed export leaves none."""
    out = Path(output)
    check_apart(out, model_inputs(model_name), "output folder", around=(("current folder", "."),))
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise RunDirError(f"output folder {out} is not empty; pass --overwrite to replace it")
    if out.exists() and not out.is_dir():
        raise OutputError(f"output folder {out} is a file, not a folder")
    check_writable_dir(out.parent, "folder of the output")
    return out


def _source_folder(model_name: str) -> Optional[Path]:
    """The local model folder ``model_name`` stands for (None: a hub id); an ONNX folder is refused."""
    inputs = dict(model_inputs(model_name))
    folder = inputs.get("model folder")
    done = exported_as(folder) if folder is not None else None
    if done is not None:
        raise ModelError(f"{folder} is an {done.name.upper()} folder already; export the model folder it was "
                         f"exported from")
    return folder


def run_export(model_name: str, output: str, ui, *, fmt: str = "transformers", merge: bool = False,
               overwrite: bool = False) -> ExportResult:
    exp = exporter(fmt)
    exp.check(merge)  # before the model loads
    out = _check_output(model_name, output, overwrite)
    folder = _source_folder(model_name)
    t0 = time.perf_counter()
    # A classifier is loaded as one (its head, pooled or native, goes into the graph); anything
    # else as an embedding model (a sentence-transformers folder's pooling and Normalize).
    classifier = folder is not None and describe_model(str(folder)).has_classifier
    sess = open_session(model_name, device="cpu", precision="fp32", embedding=not classifier)
    adapter = is_adapter_folder(sess.path)
    if merge and not adapter:
        raise ModelError(f"--merge: {sess.path} is not a LoRA adapter folder (no adapter_config.json); "
                         f"it is a plain model folder already")
    with atomic_dir(out) as tmp:
        outputs = exp.write(sess, tmp)
        card = Path(sess.path) / "README.md"
        if card.is_file():  # the card goes along, updated for what the folder now is (push needs one)
            from finetune_cli.models.card import export_card

            (tmp / "README.md").write_text(export_card(card.read_text(encoding="utf-8"), out, sess.model, exp,
                                                       adapter), encoding="utf-8")
        public_files(tmp)  # (safetensors writes its files private)
    secs = time.perf_counter() - t0
    ui.log(f"{sess.path} -> {out} ({fmt}{', adapters merged' if adapter else ''}, {secs:.1f}s)")
    return ExportResult(sess.path, str(out), fmt, adapter, outputs, round(secs, 3))
