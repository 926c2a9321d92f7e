"""``finetune predict``: a classifier (run directory, saved folder, any transformers
``*ForSequenceClassification`` folder or hub id) over a file; every input column is carried
through and the predictions are appended (``metrics.tasks.prediction_columns``).

The file is read twice with the table reader, in chunks: once to check it whole (it parses, every
row has a text, a Parquet output can hold its columns) before the model loads, then chunk by chunk
through the model into the output. Memory holds one chunk whatever the file's length. The output
is written to a temporary file renamed at the end: an interrupted run leaves no output, and a
rerun starts again from the first row.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from finetune_cli.data.sources import CHUNK_ROWS, CONVERT_HINT, TableFile, open_table
from finetune_cli.data.table_io import ColumnTypes, check_table_output, table_writer
from finetune_cli.engine.inference import open_session, parse_threshold
from finetune_cli.errors import DataError, ModelError
from finetune_cli.fsutil import check_apart
from finetune_cli.inputs import model_inputs
from finetune_cli.metrics.tasks import per_label, prediction_columns
from finetune_cli.recipe import TRUNCATION_RULES


@dataclass
class PredictResult:
    model: str
    input: str
    output: str
    rows: int
    problem_type: str
    labels: list[str]
    predicted: dict[str, int]  # label -> rows predicted with it (regression: empty)
    columns: list[str]
    seconds: float
    precision: str  # what the model ran in: fp32, bf16 or fp16
    thresholds: Optional[dict[str, float]] = None  # multi-label: each label's decision threshold

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class _Input:
    file: TableFile
    texts: list[str]  # the text column (and the pair column)
    names: list[str]  # every column, in order
    rows: int
    types: Optional[dict[str, Any]]  # a Parquet output's column types (None: another format)


def _check_input(input_path: str, output: str, texts: list[str], chunk_rows: int) -> _Input:
    """The output checked, then the whole input read once (nothing kept) before any model loads."""
    fmt = check_table_output(output, input_path)
    tf = open_table(input_path, header="yes", hint=CONVERT_HINT)
    keys = [tf.key(c) for c in texts]
    types = ColumnTypes() if fmt == "parquet" else None
    names, rows = tf.survey(None, keys, chunk_rows, each=types.add if types else None, shown=texts)
    if rows == 0:
        raise DataError(f"{input_path} has no rows")
    return _Input(tf, keys, names, rows, types.arrow_types() if types else None)


def _output_columns(spec, labels: list[str], src: _Input, input_path: str) -> tuple[list[str], dict[str, Any]]:
    """The columns predict appends (refused when the input has one) and every column's Parquet type."""
    added = list(prediction_columns(np.zeros((1, max(spec.num_labels, 1))), spec.problem_type, labels))
    clash = [c for c in added if c in src.names]
    if clash:
        raise DataError(f"{input_path} already has a column `{clash[0]}`, which predict writes; rename it")
    if src.types is None:
        return added, {}
    import pyarrow as pa

    return added, {**src.types, **{c: pa.string() if c == "pred_label" else pa.list_(pa.string())
                                   if c == "pred_labels" else pa.float64() for c in added}}


def run_predict(model_name: str, input_path: str, output: str, ui, *, column: str = "text",
                pair_column: Optional[str] = None, batch_size: int = 64, max_length: Optional[int] = None,
                device: str = "auto", precision: str = "auto", cuda_graphs: str = "off", chunk_rows: int = CHUNK_ROWS,
                truncation: Optional[str] = None, stride: Optional[int] = None,
                threshold: Optional[str] = None) -> PredictResult:
    """``truncation`` None: the rule the model was trained with; ``stride``: long rows read in
    overlapping windows whose logits are averaged (single texts only); ``threshold`` (multi-label):
    ``--threshold`` (see ``InferenceSession.decision_threshold``; None: the tuned thresholds the
    folder saved, else its single one)."""
    check_apart(output, model_inputs(model_name, whole_run=False), "--output")
    if truncation is not None and truncation not in TRUNCATION_RULES:
        raise DataError(f"--truncation {truncation}: choose one of {', '.join(TRUNCATION_RULES)}")
    if stride is not None and pair_column is not None:
        raise DataError("--stride reads one text in overlapping windows; a sentence pair (--pair-column) is cut "
                        "by --truncation instead (the longer text first)")
    parse_threshold(threshold)
    src = _check_input(input_path, output, [c for c in (column, pair_column) if c is not None], chunk_rows)
    sess = open_session(model_name, device=device, precision=precision, max_length=max_length, truncation=truncation,
                        cuda_graphs=cuda_graphs)
    model, path = sess.model, sess.path
    if not model.has_classifier:
        raise ModelError(f"{path} is an embedding model (no classification head); use `finetune embed {model_name} "
                         f"FILE --output OUT.npy` for its embeddings")
    spec, labels = model.spec, sess.label_names
    cut = sess.decision_threshold(threshold)
    added, types = _output_columns(spec, labels, src, input_path)
    counted: Counter = Counter()
    optional = set(src.names) - set(src.texts)  # a record may lack any other key
    t0 = time.perf_counter()
    with ui.progress(src.rows, "predict", transient=True) as prog, \
            table_writer(output, src.names + added, types) as write:
        chunks = src.file.chunks(chunk_rows, src.names, optional)
        for chunk, outs in sess.stream(chunks, src.texts, batch_size, joint=True, progress=prog, stride=stride):
            preds = prediction_columns(outs["logits"], spec.problem_type, labels, cut)
            write({**chunk.columns, **preds})
            counted.update(preds.get("pred_label") or [x for s in preds.get("pred_labels", []) for x in s])
    secs = time.perf_counter() - t0
    if (note := sess.length_note(stride)) is not None:
        ui.warn(f"{input_path}: {note}")
    ui.log(f"{src.rows} rows -> {output} ({src.rows / max(secs, 1e-9):.0f}/s)")
    return PredictResult(path, input_path, output, src.rows, spec.problem_type, labels, dict(counted),
                         src.names + added, round(secs, 3), sess.precision, per_label(cut, labels, spec.problem_type))
