"""GLUE tasks: the same recipe reads the hub copy (``glue:sst2``) or a local GLUE-format folder
(``--data-dir`` / ``FINETUNE_DATA_DIR``), with the same columns and label ids either way."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

from finetune_cli.errors import DataError

Col = Union[str, int]


@dataclass(frozen=True)
class GlueTask:
    folder: str
    local_cols: dict  # logical -> column name / index in the original TSVs
    hub_cols: dict  # logical -> column in the hub copy
    label_names: Optional[tuple[str, ...]]  # hub ClassLabel order; None for regression
    train_files: tuple[str, ...] = ("train.tsv",)
    eval_files: dict = field(default_factory=lambda: {"validation": ("dev.tsv",)})
    header: str = "yes"
    local_label_map: Optional[dict] = None  # raw local label -> hub label name


TASKS: dict[str, GlueTask] = {
    "sst2": GlueTask("SST-2", {"text": "sentence", "label": "label"}, {"text": "sentence", "label": "label"},
                     ("negative", "positive"), local_label_map={"0": "negative", "1": "positive"}),
    "cola": GlueTask("CoLA", {"text": 3, "label": 1}, {"text": "sentence", "label": "label"},
                     ("unacceptable", "acceptable"), header="no",
                     local_label_map={"0": "unacceptable", "1": "acceptable"}),
    "mrpc": GlueTask("MRPC", {"text": "#1 String", "text_pair": "#2 String", "label": "Quality"},
                     {"text": "sentence1", "text_pair": "sentence2", "label": "label"},
                     ("not_equivalent", "equivalent"), eval_files={"validation": ("dev.tsv",), "test": ("test_labeled_msr.txt",)},
                     local_label_map={"0": "not_equivalent", "1": "equivalent"}),
    "rte": GlueTask("RTE", {"text": "sentence1", "text_pair": "sentence2", "label": "label"},
                    {"text": "sentence1", "text_pair": "sentence2", "label": "label"},
                    ("entailment", "not_entailment")),
    "qnli": GlueTask("QNLI", {"text": "question", "text_pair": "sentence", "label": "label"},
                     {"text": "question", "text_pair": "sentence", "label": "label"},
                     ("entailment", "not_entailment")),
    "qqp": GlueTask("QQP", {"text": "question1", "text_pair": "question2", "label": "is_duplicate"},
                    {"text": "question1", "text_pair": "question2", "label": "label"},
                    ("not_duplicate", "duplicate"), train_files=("train.tsv", "train_subset.tsv"),
                    local_label_map={"0": "not_duplicate", "1": "duplicate"}),
    "stsb": GlueTask("STS-B", {"text": "sentence1", "text_pair": "sentence2", "label": "score"},
                     {"text": "sentence1", "text_pair": "sentence2", "label": "label"}, None),
    "mnli": GlueTask("MNLI", {"text": "sentence1", "text_pair": "sentence2", "label": "gold_label"},
                     {"text": "premise", "text_pair": "hypothesis", "label": "label"},
                     ("entailment", "neutral", "contradiction"),
                     eval_files={"validation_matched": ("dev_matched.tsv",), "validation": ("dev_matched.tsv",),
                                 "validation_mismatched": ("dev_mismatched.tsv",)}),
    "wnli": GlueTask("WNLI", {"text": "sentence1", "text_pair": "sentence2", "label": "label"},
                     {"text": "sentence1", "text_pair": "sentence2", "label": "label"},
                     ("not_entailment", "entailment"), local_label_map={"0": "not_entailment", "1": "entailment"}),
}


def parse_dataset(spec: str) -> tuple[str, Optional[str]]:
    """``glue:sst2`` -> ("glue", "sst2"); ``glue/sst2`` is accepted for GLUE tasks; ``imdb`` -> ("imdb", None)."""
    if ":" in spec:
        name, config = spec.split(":", 1)
        return name, config or None
    head, _, tail = spec.rpartition("/")
    if head.split("/")[-1] == "glue" and tail in TASKS:
        return head, tail
    return spec, None


def glue_task(name: str, config: Optional[str]) -> Optional[GlueTask]:
    if name.split("/")[-1] == "glue":
        if config not in TASKS:
            raise DataError(f"unknown GLUE task `{config}` (known: {', '.join(TASKS)})")
        return TASKS[config]
    return None


def local_file(task: GlueTask, data_dir: Path, split: str, train_split: str) -> Path:
    folder = data_dir / task.folder
    if split == train_split:
        candidates = task.train_files
    else:
        candidates = task.eval_files.get(split)
        if candidates is None:
            raise DataError(f"GLUE task folder {folder} has no split `{split}` here (have: {', '.join(task.eval_files)})")
    for c in candidates:
        if (folder / c).is_file():
            return folder / c
    raise DataError(f"no {split} file for GLUE task in {folder} (looked for {', '.join(candidates)})")
