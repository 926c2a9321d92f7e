"""Export formats as a table: a new format is one :class:`Exporter` entry (and its module) and a test.

Each entry says what it needs before any model loads (a missing package, a flag), writes the folder
from a loaded inference session, says what the card of such a folder reads (its line, library, tags,
"Use it" snippet), and, for a format that loads back, recognises its folders and loads them for
inference. ``pipelines/export.py`` (the command), ``models/card.py`` (the card) and
``engine/inference.py`` (loading) read this table; none of them names a format.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from finetune_cli.errors import ModelError


@dataclass(frozen=True)
class Exporter:
    """One export format.

    ``check(merge)``: refuse, in one line, what this format cannot do, before the model loads.
    ``write(session, folder) -> outputs``: write the folder (the session is an
    ``engine.inference.InferenceSession``); returns what the model computes (``logits``,
    ``embeddings``). ``what``: the card's line saying what the folder is. ``library(kind)``: the
    card's ``library_name`` for a model of this kind (``embedding``, ``native``, ``pooled``); ``tags``
    added to the card's, ``drop_tags`` removed from it when an adapter was folded in.
    ``snippet(kind, name, model, card_body)``: the card's "Use it" section. ``recognise(folder)``
    and ``load(folder, device, embedding) -> (model, tokenizer, path, st)``: a folder of this
    format, loaded for inference (None: it loads as any model folder does)."""

    name: str
    check: Callable[[bool], None]
    write: Callable[[Any, Path], list[str]]
    what: str
    library: Callable[[str], str]
    snippet: Callable[[str, str, Any, str], str]
    tags: tuple[str, ...] = ()
    drop_tags: tuple[str, ...] = ("peft", "lora")  # every format folds a LoRA adapter in
    recognise: Optional[Callable[[Path], bool]] = None
    load: Optional[Callable[..., Any]] = None


# ---- transformers: a LoRA adapter merged into the weights ---------------------------------------

def _check_merged(merge: bool) -> None:
    if not merge:
        raise ModelError("--format transformers writes a merged LoRA adapter: pass --merge (or --format onnx)")


def _write_merged(sess, out: Path) -> list[str]:
    from finetune_cli.models.loading import HEAD_SPEC, default_max_length, save_text_model

    model, src = sess.model, Path(sess.path)
    meta = json.loads((src / HEAD_SPEC).read_text()) if (src / HEAD_SPEC).is_file() else {}
    save_text_model(model, sess.tokenizer, out, id2label=getattr(model.config, "id2label", None), extra=meta,
                    max_length=default_max_length(sess.path, sess.tokenizer),
                    normalize_embeddings=bool(sess.st is not None and sess.st.normalize))
    return ["logits", "embeddings"] if model.has_classifier else ["embeddings"]


def _merged_snippet(kind: str, name: str, model, body: str) -> str:
    from finetune_cli.models.card import _is_pair_card, _snippet

    return _snippet(kind, name, model.spec.problem_type, model.spec.normalize, _is_pair_card(body))


# ---- onnx: the graph, run in onnxruntime --------------------------------------------------------

def _check_onnx(merge: bool) -> None:
    from finetune_cli.models.onnx import require_onnx

    require_onnx("--format onnx", exporter=True)


def _write_onnx(sess, out: Path) -> list[str]:
    from finetune_cli.data.encode import collate
    from finetune_cli.models.onnx import copy_folder_files, export_onnx

    model = sess.model
    copy_folder_files(Path(sess.path), out)
    if not (out / "config.json").is_file():  # an embedding adapter's config is its base's
        model.config.save_pretrained(out)
    sample = sess.encode_texts(["An example sentence to trace.", "Another one, a little longer."])
    return export_onnx(model, collate(sample, [0, 1], sess.pad_id)["features"][0], out)


def _onnx_snippet(kind: str, name: str, model, body: str) -> str:
    from finetune_cli.models.card import _onnx_snippet as snippet

    return snippet(kind, name)


def _recognise_onnx(folder: Path) -> bool:
    from finetune_cli.models.onnx import is_onnx_folder

    return Path(folder).is_dir() and is_onnx_folder(folder)


def _load_onnx(folder: str, device, embedding: bool):
    from finetune_cli.models.onnx import load_onnx_folder

    return load_onnx_folder(folder, device, embedding)


EXPORTERS: dict[str, Exporter] = {
    "transformers": Exporter(
        "transformers", _check_merged, _write_merged,
        what="This folder is the model below with its LoRA adapters merged into the weights (`finetune export "
             "--merge`): a plain folder, no peft needed; the training record is the source's.",
        library=lambda kind: "sentence-transformers" if kind == "embedding" else "transformers",
        snippet=_merged_snippet),
    "onnx": Exporter(
        "onnx", _check_onnx, _write_onnx,
        what="This folder is the ONNX export (`model.onnx`, opset 18, fp32; LoRA adapters folded in) of the model "
             "below, written by `finetune export --format onnx`; the training record is the source's.",
        library=lambda kind: "sentence-transformers" if kind == "embedding" else "onnx",
        snippet=_onnx_snippet, tags=("onnx",), recognise=_recognise_onnx, load=_load_onnx),
}


def exporter(name: str) -> Exporter:
    """The entry for ``--format name``; one line naming the formats otherwise."""
    if name not in EXPORTERS:
        raise ModelError(f"--format {name}: choose one of {', '.join(EXPORTERS)}")
    return EXPORTERS[name]


def exported_as(folder: str | Path) -> Optional[Exporter]:
    """The format a folder was exported in, when it loads back its own way (an ONNX folder), else None."""
    return next((e for e in EXPORTERS.values() if e.recognise is not None and e.recognise(Path(folder))), None)
