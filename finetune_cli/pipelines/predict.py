"""``finetune predict``: a classifier (run directory, saved folder, any transformers
``*ForSequenceClassification`` folder or hub id) over a file; every input column is carried
through and the predictions are appended (``metrics.tasks.prediction_columns``)."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Optional

from finetune_cli.data.sources import Table
from finetune_cli.data.table_io import read_columns, write_columns
from finetune_cli.engine.inference import open_session
from finetune_cli.errors import DataError, ModelError
from finetune_cli.metrics.tasks import prediction_columns


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

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def run_predict(model_name: str, input_path: str, output: str, ui, *, column: str = "text",
                pair_column: Optional[str] = None, batch_size: int = 64, max_length: Optional[int] = None,
                device: str = "auto", precision: str = "auto") -> PredictResult:
    cols = read_columns(input_path)
    for c in (column, pair_column):
        if c is not None and c not in cols:
            raise DataError(f"{input_path} has no column `{c}` (columns: {', '.join(cols)}); pass --column")
    sess = open_session(model_name, device=device, precision=precision, max_length=max_length)
    model, path = sess.model, sess.path
    if not model.has_classifier:
        raise ModelError(f"{path} is an embedding model (no classification head); use `finetune embed {model_name} "
                         f"--input FILE --output OUT.npy` for its embeddings")
    spec = model.spec
    id2label = getattr(model.config, "id2label", None) or {}
    names = [str(id2label[i]) for i in sorted(id2label)][: spec.num_labels]
    texts = {"text": ["" if v is None else str(v) for v in cols[column]]}
    if pair_column is not None:
        texts["text_pair"] = ["" if v is None else str(v) for v in cols[pair_column]]
    enc = sess.encode(Table(texts, input_path), tuple(texts), joint=True, use_cache=False)
    t0 = time.perf_counter()
    with ui.progress(len(enc), "predict", transient=True) as prog:
        logits = sess.forward(enc, batch_size, progress=prog)["logits"]
    secs = time.perf_counter() - t0
    preds = prediction_columns(logits, spec.problem_type, names, spec.threshold)
    clash = [c for c in preds if c in cols]
    if clash:
        raise DataError(f"{input_path} already has a column `{clash[0]}`, which predict writes; rename it")
    write_columns(output, {**cols, **preds})
    counted = preds.get("pred_label") or [x for s in preds.get("pred_labels", []) for x in s]
    ui.log(f"{len(enc)} rows -> {output} ({len(enc) / max(secs, 1e-9):.0f}/s)")
    return PredictResult(path, input_path, output, len(enc), spec.problem_type, names, dict(Counter(counted)),
                         list(cols) + list(preds), round(secs, 3), sess.precision)
