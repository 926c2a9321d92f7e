"""Bad input, table-driven: every case through the CLI runner ends with exit code N, exactly one
``error:`` line on stderr (the last one) naming the file or key, no traceback, and for writers no
output left behind that a rerun would trust.

A new case is one row. ``{name}`` in a row is filled from the case context: ``tmp`` (the case's own
folder), ``model`` (tiny BERT), ``run`` (a fresh copy of a finished tiny run), ``partial`` (a copy
of the same run cut before its end: checkpoints only), data files written on demand (``latin1_tsv``,
``scalar_json`` …), ``afile`` (a plain file, to put outputs on or under) and ``ro`` (a read-only
folder).

``BAD_INPUT_CENSUS=FILE`` records each case's outcome (traceback or not) instead of asserting: the
note of issue 17 counts how many cases were tracebacks before the change with it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import pytest
from typer.testing import CliRunner

from finetune_cli.cli.main import app

QUICKSTART = Path(__file__).resolve().parents[2] / "finetune_cli" / "resources" / "quickstart"
runner = CliRunner()
CENSUS = os.environ.get("BAD_INPUT_CENSUS")

# ---- data files, written on demand ------------------------------------------------------------

LATIN1 = "sentence\tlabel\nfine food\tpositive\ncaf\xe9 au lait, tr\xe8s bien\tpositive\nbad\tnegative\n"
DATA: dict[str, tuple[str, Union[str, bytes]]] = {
    "latin1_tsv": ("latin1.tsv", LATIN1.encode("latin-1")),
    "latin1_txt": ("latin1.txt", "one sentence\ncaf\xe9 au lait\n".encode("latin-1")),
    "latin1_yaml": ("latin1.yaml", "# caf\xe9\ntrain: {epochs: 1}\n".encode("latin-1")),
    "scalar_json": ("scalar.json", "42\n"),
    "object_json": ("object.json", '{"sentence": "a", "label": "positive"}\n'),
    "bad_parquet": ("bad.parquet", b"PAR1\x00\x01garbage that is not a parquet footer"),
    "empty_label_tsv": ("empty_label.tsv", "sentence\tlabel\ngood\tpositive\nbad\t\nok\tnegative\n"),
    "nan_label_tsv": ("nan_label.tsv", "sentence\tlabel\ngood\tpositive\nbad\tNaN\nok\tnegative\n"),
    "null_label_jsonl": ("null_label.jsonl", '{"sentence": "good", "label": "positive"}\n'
                                             '{"sentence": "bad", "label": null}\n'
                                             '{"sentence": "ok", "label": "negative"}\n'),
    "nan_label_jsonl": ("nan_label.jsonl", '{"sentence": "good", "label": "positive"}\n'
                                           '{"sentence": "bad", "label": NaN}\n'
                                           '{"sentence": "ok", "label": "negative"}\n'),
    "empty_text_tsv": ("empty_text.tsv", "sentence\tlabel\ngood\tpositive\n  \tnegative\nok\tnegative\n"),
    "null_text_jsonl": ("null_text.jsonl", '{"sentence": "good", "label": "positive"}\n'
                                           '{"sentence": null, "label": "negative"}\n'
                                           '{"sentence": "ok", "label": "negative"}\n'),
    "number_text_jsonl": ("number_text.jsonl", '{"sentence": "good", "label": "positive"}\n'
                                               '{"sentence": 3.5, "label": "negative"}\n'
                                               '{"sentence": "ok", "label": "negative"}\n'),
    "text_null_jsonl": ("text_null.jsonl", '{"text": "good"}\n{"text": null}\n'),
    "text_number_jsonl": ("text_number.jsonl", '{"text": "good"}\n{"text": 7}\n'),
    "sts_nan_tsv": ("sts_nan.tsv", "sentence1\tsentence2\tscore\na cat\ta dog\t1.5\nsun\tmoon\tnan\n"
                                   "red\tblue\t2.0\n"),
    "sts_inf_tsv": ("sts_inf.tsv", "sentence1\tsentence2\tscore\na cat\ta dog\t1.5\nsun\tmoon\tinf\n"
                                   "red\tblue\t2.0\n"),
    "sentences_txt": ("sentences.txt", "a cat sat\nthe dog ran\nsun and moon\nred and blue\n"),
    "scalar_yaml": ("scalar.yaml", "just a string\n"),
    "good_tsv": ("good.tsv", "sentence\tlabel\ngood\tpositive\nbad\tnegative\n"),
    "line3_jsonl": ("line3.jsonl", '{"sentence": "good"}\n{"sentence": "bad"}\n{"sentence": oops}\n'),
    "list_text_jsonl": ("list_text.jsonl", '{"sentence": "good", "label": "positive"}\n'
                                           '{"sentence": ["a", "b"], "label": "negative"}\n'),
    "no_text_jsonl": ("no_text.jsonl", '{"sentence": "good"}\n{"id": 7}\n'),
    "dup_header_tsv": ("dup_header.tsv", "sentence\tsentence\tlabel\ngood\tfine\tpositive\nbad\tawful\tnegative\n"),
    "dup_key_jsonl": ("dup_key.jsonl", '{"sentence": "good", "label": "positive"}\n'
                                       '{"sentence": "bad", "sentence": "worse", "label": "negative"}\n'),
    "mixed_id_jsonl": ("mixed_id.jsonl", '{"sentence": "good", "id": 1}\n{"sentence": "bad", "id": "x"}\n'),
    "long_header_tsv": ("long_header.tsv", "sentence\t" + "h" * (1 << 20) + "\ngood\tx\n"),
    "long_row_tsv": ("long_row.tsv", "sentence\tlabel\ngood\tpositive\n" + "w " * (1 << 19) + "x\tnegative\n"),
    "long_line_txt": ("long_line.txt", "a cat\n" + "w" * ((1 << 20) + 1) + "\n"),
    "gzip_tsv": ("rows.tsv", b"\x1f\x8b\x08\x00compressed bytes"),
    "no_ext": ("rows", "sentence\tlabel\ngood\tpositive\n"),
    "nested_labels_jsonl": ("nested.jsonl", '{"sentence": "fun", "label": ["comedy"]}\n'
                                            '{"sentence": "sad", "label": [["comedy"], 3]}\n'),
}

RUN_OVERRIDES = ["model.max_length=32", f"data.train={QUICKSTART / 'train.tsv'}",
                 f"data.eval={QUICKSTART / 'dev.tsv'}", "data.columns.text=sentence", "data.max_train_samples=16",
                 "data.max_eval_samples=16", "train.batch_size=8", "train.max_steps=2", "train.save_every=1",
                 "train.eval_every=1", "train.keep_checkpoints=2", "train.lr=1e-3", "output.name=t"]


class Ctx(dict):
    """Template values; the expensive ones (copies of runs, files) are made on first use."""

    def __init__(self, tmp: Path, model: Path, run: Path, request: Any = None):
        super().__init__(tmp=str(tmp), model=str(model))
        self.tmp, self._run, self._request = tmp, run, request

    def __missing__(self, key: str) -> str:
        if key in DATA:
            name, content = DATA[key]
            p = self.tmp / "data" / name
            p.parent.mkdir(exist_ok=True)
            p.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
            value = str(p)
        elif key == "run":  # a finished run
            value = str(shutil.copytree(self._run, self.tmp / "runs" / "t"))
        elif key == "partial":  # the same run, cut after its checkpoints (a rerun resumes it)
            p = Path(shutil.copytree(self._run, self.tmp / "runs" / "t"))
            (p / "summary.json").unlink()
            shutil.rmtree(p / "final")
            value = str(p)
        elif key == "afile":
            p = self.tmp / "afile"
            p.write_text("not a folder\n")
            value = str(p)
        elif key == "adir":
            p = self.tmp / "adir.npy"
            p.mkdir()
            value = str(p)
        elif key == "fifo":
            p = self.tmp / "fifo.tsv"
            os.mkfifo(p)
            value = str(p)
        elif key == "model_copy":  # a model folder the case may damage
            value = str(shutil.copytree(self["model"], self.tmp / "model"))
        elif key == "adapter":  # a copy of a LoRA classifier's adapter folder
            value = str(shutil.copytree(self._request.getfixturevalue("lora_adapter"), self.tmp / "adapter"))
        elif key == "onnx_embed":  # a copy of an ONNX folder of the tiny encoder (an embedding graph)
            value = str(shutil.copytree(self._request.getfixturevalue("onnx_embedding"), self.tmp / "onnx"))
        elif key == "wide_model":  # another model: a BERT 48 wide, with the tiny one's tokenizer
            value = str(self._request.getfixturevalue("wide_model_dir"))
        elif key == "loop":  # a symbolic link to itself
            p = self.tmp / "loop.tsv"
            p.symlink_to(p)
            value = str(p)
        elif key == "ro":
            p = self.tmp / "ro"
            p.mkdir()
            p.chmod(0o555)
            value = str(p)
        else:
            raise KeyError(key)
        self[key] = value
        return value


def fill(template: str, ctx: Ctx) -> str:
    return template.format_map(ctx)


@dataclass
class Case:
    id: str
    argv: list[str]
    code: int
    expect: list[str]  # substrings of the error line (templates)
    setup: Optional[Callable[[Ctx], Any]] = None
    left: list[str] = field(default_factory=list)  # paths that must not exist afterwards (templates)
    patch: Optional[Callable[[pytest.MonkeyPatch], Any]] = None  # e.g. a writer that finds the disk full
    kept: list[str] = field(default_factory=list)  # paths that must be there afterwards, files unchanged
    cwd: Optional[str] = None  # the folder the command runs in (a template)


def C(id: str, argv: list[str], code: int, *expect: str, setup=None, left=(), patch=None, kept=(), cwd=None) -> Any:
    return pytest.param(Case(id, argv, code, list(expect), setup, list(left), patch, list(kept), cwd), id=id)


TRAIN = ["train", "-r", "quickstart", "model.name={model}", *RUN_OVERRIDES, "output.dir={tmp}/runs",
         "--device", "cpu", "-q"]
EVAL = ["eval", "{run}", "--device", "cpu", "--no-figures", "-q"]
EMBED = ["embed", "{run}", "--device", "cpu", "-q"]
PREDICT = ["predict", "{run}", "-i", "{good_tsv}", "-c", "sentence", "-o", "{tmp}/p.csv", "--device", "cpu", "-q"]
AUG = ["augment", "--delete-words", "0.3", "-q"]
EXPORT = ["export", "{run}", "--merge", "-q", "-o"]
REPORT = ["report", "{run}", "--no-plot"]
PROBE = ["probe", "sequential", "-r", "probe_sequential", "model.name={model}", "output.dir={tmp}/runs", "-q"]
SEED_HUGE = str(2**63)
PRED = ["predict", "{run}", "-c", "sentence", "--device", "cpu", "-q"]
ONNX = ["export", "{run}", "--format", "onnx", "-q", "-o"]
KEEP_RUN = ["{run}/summary.json", "{run}/metrics.jsonl", "{run}/best/config.json", "{run}/best/model.safetensors",
            "{run}/checkpoint-2/trainer_state.json"]
TOKENIZER = ["{onnx_embed}/tokenizer.json", "{onnx_embed}/vocab.txt", "{onnx_embed}/tokenizer_config.json",
             "{onnx_embed}/special_tokens_map.json"]


def _upload_nothing(mp: pytest.MonkeyPatch) -> None:
    def upload(*_a, **_k):
        raise AssertionError("push uploaded")
    mp.setattr("finetune_cli.pipelines.push._upload", upload)
NOT_MODEL = ["{tmp}/runs/t/best", "{tmp}/runs/t/checkpoint-1"]


def _full_disk_at(target: str, name: str, exc: Callable[[], BaseException] = lambda: OSError(
        errno.ENOSPC, "No space left on device")) -> Callable[[pytest.MonkeyPatch], None]:
    """A writer that finds the disk full: ``target``'s attribute ``name`` raises."""
    def patch(mp: pytest.MonkeyPatch) -> None:
        import importlib

        def full(*_a, **_k):
            raise exc()
        mp.setattr(importlib.import_module(target), name, full)
    return patch


def _safetensors_full() -> BaseException:
    from safetensors import SafetensorError

    return SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


def _set_config(key: str, value: Any) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        f = Path(ctx["model_copy"]) / "config.json"
        f.write_text(json.dumps({**json.loads(f.read_text()), key: value}))
    return setup


def _write(rel: str, text: Union[str, bytes]) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        p = Path(fill(rel, ctx))
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return setup


def _truncate(rel: str, keep: float = 0.5) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        p = Path(fill(rel, ctx))
        data = p.read_bytes()
        p.write_bytes(data[: int(len(data) * keep)])
    return setup


def _json_edit(rel: str, fn: Callable[[Any], Any]) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        p = Path(fill(rel, ctx))
        p.write_text(json.dumps(fn(json.loads(p.read_text()))))
    return setup


def _link(rel: str, target: str) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        t = Path(fill(target, ctx))
        if not t.exists():
            t.parent.mkdir(parents=True, exist_ok=True)
            t.write_text("hf_secret_token\n")
        Path(fill(rel, ctx)).symlink_to(t)
    return setup


def _hard_link(rel: str, target: str) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        t, p = Path(fill(target, ctx)), Path(fill(rel, ctx))
        t.write_text("precious\n")
        p.parent.mkdir(parents=True, exist_ok=True)
        os.link(t, p)
    return setup


def _copy(src: str, dst: str) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        shutil.copy2(fill(src, ctx), fill(dst, ctx))
    return setup


def _delete(*rels: str) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        for rel in rels:
            p = Path(fill(rel, ctx))
            shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
    return setup


def _base_of_adapter(base: str) -> Callable[[Ctx], None]:
    """The adapter copy's ``base_model_name_or_path`` set to ``base``."""
    def setup(ctx: Ctx) -> None:
        f = Path(ctx["adapter"]) / "adapter_config.json"
        f.write_text(json.dumps({**json.loads(f.read_text()), "base_model_name_or_path": fill(base, ctx)}))
    return setup


def _both(*fns: Callable[[Ctx], None]) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        for f in fns:
            f(ctx)
    return setup


CASES = [
    # ---- train: recipe values ----------------------------------------------------------------
    C("train-epochs-inf", [*TRAIN, "train.epochs=.inf", "~train.max_steps"], 2, "train.epochs", "finite"),
    C("train-lr-inf", [*TRAIN, "train.lr=1e999"], 2, "train.lr", "finite"),
    C("train-lr-nan", [*TRAIN, "train.lr=.nan"], 2, "train.lr"),
    C("train-seed-huge", [*TRAIN, f"train.seed={SEED_HUGE}"], 2, "train.seed"),
    C("train-seed-negative", [*TRAIN, "train.seed=-1"], 2, "train.seed"),
    C("train-data-seed-huge", [*TRAIN, "data.seed=99999999999999999999"], 2, "data.seed"),
    C("train-max-length-over-model", [*TRAIN, "model.max_length=4096"], 2, "model.max_length", "128"),
    C("train-reinit-layers-over", [*TRAIN, "model.reinit_layers=3"], 2, "model.reinit_layers", "2 layers"),
    C("train-reinit-layers-negative", [*TRAIN, "model.reinit_layers=-1"], 2, "model.reinit_layers"),
    C("train-metric-typo", [*TRAIN, "train.metric=acc"], 2, "train.metric"),
    C("train-encoding-unknown", [*TRAIN, "data.encoding=klingon"], 2, "data.encoding"),
    C("train-override-no-equals", [*TRAIN, "train.epochs"], 2, "train.epochs"),
    C("train-precision-fp16-cpu", [*TRAIN, "train.precision=fp16"], 3, "fp16"),
    # ---- train: data ---------------------------------------------------------------------------
    C("train-latin1", [*TRAIN, "data.train={latin1_tsv}"], 2, "latin1.tsv", "byte", "row 3", "data.encoding"),
    C("train-latin1-eval", [*TRAIN, "data.eval={latin1_tsv}"], 2, "latin1.tsv", "data.encoding"),
    C("train-json-scalar", [*TRAIN, "data.train={scalar_json}"], 2, "scalar.json"),
    C("train-json-object", [*TRAIN, "data.train={object_json}"], 2, "object.json"),
    C("train-parquet-corrupt", [*TRAIN, "data.train={bad_parquet}"], 2, "bad.parquet"),
    C("train-label-empty", [*TRAIN, "data.train={empty_label_tsv}"], 2, "row 3", "empty_label.tsv"),
    C("train-label-nan-tsv", [*TRAIN, "data.train={nan_label_tsv}"], 2, "row 3", "nan_label.tsv"),
    C("train-label-null-jsonl", [*TRAIN, "data.train={null_label_jsonl}"], 2, "row 2", "null_label.jsonl"),
    C("train-label-nan-jsonl", [*TRAIN, "data.train={nan_label_jsonl}"], 2, "row 2", "nan_label.jsonl"),
    C("train-label-nan-eval", [*TRAIN, "data.eval={nan_label_tsv}"], 2, "row 3", "nan_label.tsv"),
    C("train-text-empty", [*TRAIN, "data.train={empty_text_tsv}"], 2, "row 3", "empty_text.tsv"),
    C("train-text-null", [*TRAIN, "data.train={null_text_jsonl}"], 2, "row 2", "null_text.jsonl"),
    C("train-text-number", [*TRAIN, "data.train={number_text_jsonl}"], 2, "row 2", "number_text.jsonl"),
    C("train-sts-gold-nan", ["train", "-r", "simcse_unsup", "model.name={model}", "data.train={sentences_txt}",
                             "data.eval={sts_nan_tsv}", "train.max_steps=1", "train.batch_size=2",
                             "output.dir={tmp}/runs", "--device", "cpu", "-q"], 2, "row 3", "sts_nan.tsv"),
    C("train-sts-gold-inf", ["train", "-r", "simcse_unsup", "model.name={model}", "data.train={sentences_txt}",
                             "data.eval={sts_inf_tsv}", "train.max_steps=1", "train.batch_size=2",
                             "output.dir={tmp}/runs", "--device", "cpu", "-q"], 2, "row 3", "sts_inf.tsv"),
    # ---- train: outputs and run directories ---------------------------------------------------
    C("train-output-dir-is-file", [*TRAIN, "output.dir={afile}"], 5, "afile"),
    C("train-output-dir-under-file", [*TRAIN, "output.dir={afile}/sub"], 5, "afile"),
    C("train-output-dir-read-only", [*TRAIN, "output.dir={ro}/runs"], 5, "ro", "read-only"),
    C("train-run-recipe-garbage", TRAIN, 2, "recipe.yaml",
      setup=_both(lambda c: c["partial"], _write("{tmp}/runs/t/recipe.yaml", ": : [garbage\n"))),
    C("train-run-recipe-scalar", TRAIN, 2, "recipe.yaml",
      setup=_both(lambda c: c["partial"], _write("{tmp}/runs/t/recipe.yaml", "42\n"))),
    C("train-no-intact-checkpoint", [*TRAIN], 2, "no intact checkpoint", "checkpoint-2",
      setup=_both(lambda c: c["partial"], _truncate("{tmp}/runs/t/checkpoint-1/trainer_state.json"),
                  _truncate("{tmp}/runs/t/checkpoint-2/model/model.safetensors"))),
    C("train-resume-corrupt", [*TRAIN, "--resume", "{tmp}/runs/t/checkpoint-2"], 2, "checkpoint-2",
      setup=_both(lambda c: c["partial"], _truncate("{tmp}/runs/t/checkpoint-2/trainer_state.json"))),
    C("train-resume-missing", [*TRAIN, "--resume", "{tmp}/nope"], 2, "nope"),
    # another run's checkpoint: only the key whose value differs is named, not a parameter set to
    # the default the checkpoint's run trained with
    C("train-resume-other-run-names-what-differs", [*TRAIN, "output.name=u", "objective.label_smoothing=0.0",
                                                    "train.lr=2e-3", "--resume", "{run}/checkpoint-2"], 2,
      "checkpoint holds a different run (train.lr: 0.001 there, 0.002 now);", left=["{tmp}/runs/u"],
      kept=["{run}/checkpoint-2/trainer_state.json"]),
    C("train-rerun-other-run-names-what-differs", [*TRAIN, "objective.label_smoothing=0.0", "train.lr=2e-3"], 2,
      "holds a different run (train.lr: 0.001 there, 0.002 now);", setup=lambda c: c["partial"],
      kept=["{tmp}/runs/t/checkpoint-2/trainer_state.json"]),
    C("train-unknown-option", [*TRAIN, "--nope"], 2, "--nope"),
    C("train-no-recipe", ["train", "-q"], 2, "--recipe"),
    C("train-device-unknown", [*TRAIN, "--device", "tpu"], 2, "tpu"),
    C("train-seeds-garbage", [*TRAIN, "--seeds", "a-b"], 2, "--seeds"),
    C("train-drop-unknown-key", [*TRAIN, "~train.max_step"], 2, "~train.max_step", "did you mean `train.max_steps`"),
    C("train-header-twice", [*TRAIN, "data.train={dup_header_tsv}"], 2, "column `sentence` appears twice",
      "dup_header.tsv", left=NOT_MODEL),
    C("train-json-key-twice", [*TRAIN, "data.train={dup_key_jsonl}"], 2, "`sentence` appears twice", "row 2"),
    C("train-text-list", [*TRAIN, "data.train={list_text_jsonl}"], 2, "row 2", "list", "list_text.jsonl"),
    C("train-multi-label-nested", [*TRAIN, "data.train={nested_labels_jsonl}", "data.eval={nested_labels_jsonl}",
                                   "model.problem_type=multi_label_classification", "~train.metric"], 2,
      "row 2", "nested.jsonl", "flat list"),
    C("train-data-is-dir", [*TRAIN, "data.train={tmp}"], 2, "is a directory"),
    C("train-data-fifo", [*TRAIN, "data.train={fifo}"], 2, "fifo.tsv", "not a regular file"),
    C("train-disk-full", TRAIN, 5, "no space left", "{tmp}/runs/t", left=NOT_MODEL,
      patch=_full_disk_at("transformers.modeling_utils", "safe_save_file", _safetensors_full)),
    C("train-model-hidden-size", [*TRAIN, "model.name={model_copy}"], 2, "config.json", "`hidden_size` is -5",
      setup=_set_config("hidden_size", -5), left=NOT_MODEL),
    # ---- train --nproc: checked in this process before N are started; sharded accelerate configs
    C("train-nproc-recipe-typo", [*TRAIN, "train.lrr=1e-4", "--nproc", "2"], 2, "train.lrr", "train.lr",
      left=["{tmp}/runs"]),
    C("train-nproc-data-latin1", [*TRAIN, "data.train={latin1_tsv}", "--nproc", "2"], 2, "latin1.tsv", "row 3",
      left=["{tmp}/runs"]),
    C("train-nproc-cuda-without-gpu", [*TRAIN, "--device", "cuda", "--nproc", "2"], 2, "--device cuda", "no CUDA",
      left=["{tmp}/runs"], patch=lambda mp: mp.setattr("torch.cuda.is_available", lambda: False)),
    C("train-nproc-precision-fp16-cpu", [*TRAIN, "train.precision=fp16", "--nproc", "2"], 3, "fp16",
      left=["{tmp}/runs"]),
    C("train-nproc-fsdp-config", [*TRAIN, "--nproc", "2"], 2, "FSDP", "ACCELERATE_USE_FSDP", left=["{tmp}/runs"],
      patch=lambda mp: mp.setenv("ACCELERATE_USE_FSDP", "true")),
    C("train-deepspeed-config", TRAIN, 2, "DeepSpeed", "cannot shard", left=["{tmp}/runs/t/checkpoint-1"],
      patch=lambda mp: mp.setenv("ACCELERATE_USE_DEEPSPEED", "true")),
    # ---- eval ---------------------------------------------------------------------------------
    C("eval-bins-zero", [*EVAL, "--bins", "0"], 2, "--bins"),
    C("eval-batch-size-zero", [*EVAL, "--batch-size", "0"], 2, "--batch-size"),
    C("eval-tsne-max-small", [*EVAL, "--tsne-max", "1"], 2, "--tsne-max"),
    C("eval-out-is-file", [*EVAL, "--out", "{afile}"], 5, "afile"),
    C("eval-out-under-file", [*EVAL, "--out", "{afile}/x"], 5, "afile"),
    C("eval-out-read-only", [*EVAL, "--out", "{ro}/ev"], 5, "read-only", left=["{ro}/ev/eval.json"]),
    C("eval-latin1", [*EVAL, "data.eval={latin1_tsv}"], 2, "latin1.tsv", "data.encoding"),
    C("eval-json-scalar", [*EVAL, "data.eval={scalar_json}"], 2, "scalar.json"),
    C("eval-parquet-corrupt", [*EVAL, "data.eval={bad_parquet}"], 2, "bad.parquet"),
    C("eval-label-nan", [*EVAL, "data.eval={nan_label_tsv}"], 2, "row 3", "nan_label.tsv"),
    C("eval-text-null", [*EVAL, "data.eval={null_text_jsonl}"], 2, "row 2", "null_text.jsonl"),
    C("eval-max-length-over-model", [*EVAL, "model.max_length=4096"], 2, "model.max_length"),
    C("eval-data-before-model", [*EVAL, "data.eval={dup_header_tsv}"], 2, "appears twice",
      setup=_truncate("{run}/best/model.safetensors")),
    C("eval-best-safetensors-truncated", EVAL, 2, "model.safetensors",
      setup=_truncate("{run}/best/model.safetensors")),
    C("eval-best-config-garbage", EVAL, 2, "config.json", setup=_write("{run}/best/config.json", "{garbage")),
    C("eval-best-head-spec-garbage", EVAL, 2, "finetune_model.json",
      setup=_write("{run}/best/finetune_model.json", "[1, 2")),
    C("eval-run-recipe-garbage", EVAL, 2, "recipe.yaml", setup=_write("{run}/recipe.yaml", "model: [\n")),
    C("eval-missing-model", ["eval", "{tmp}/nothing", "data.eval={good_tsv}", "-q"], 2, "nothing"),
    C("eval-precision-fp16-cpu", [*EVAL, "--precision", "fp16"], 2, "--precision fp16", "GPU"),
    C("eval-precision-unknown", [*EVAL, "--precision", "fp8"], 2, "--precision", "fp8"),
    # ---- predict ------------------------------------------------------------------------------
    C("predict-precision-fp16-cpu", [*PREDICT, "--precision", "fp16"], 2, "--precision fp16", "GPU",
      left=["{tmp}/p.csv"]),
    C("predict-threshold-single-label", [*PREDICT, "--threshold", "0.3"], 2, "--threshold 0.3",
      "single_label_classification", left=["{tmp}/p.csv"]),
    C("predict-threshold-garbage", [*PREDICT, "--threshold", "high"], 2, "--threshold high", "between 0 and 1",
      left=["{tmp}/p.csv"]),
    C("eval-threshold-single-label", [*EVAL, "--threshold", "tuned"], 2, "--threshold tuned",
      "single_label_classification"),
    C("predict-jsonl-line-3", [*PRED, "-i", "{line3_jsonl}", "-o", "{tmp}/p.csv"], 2, "line3.jsonl", "line 3",
      left=["{tmp}/p.csv"]),
    C("predict-latin1", [*PRED, "-i", "{latin1_tsv}", "-o", "{tmp}/p.csv"], 2, "latin1.tsv", "byte", "row 3"),
    C("predict-text-null", [*PRED, "-i", "{null_text_jsonl}", "-o", "{tmp}/p.csv"], 2, "row 2", "null"),
    C("predict-text-missing", [*PRED, "-i", "{no_text_jsonl}", "-o", "{tmp}/p.csv"], 2, "row 2", "no_text.jsonl"),
    C("predict-text-list", [*PRED, "-i", "{list_text_jsonl}", "-o", "{tmp}/p.csv"], 2, "row 2", "list"),
    C("predict-text-number", [*PRED, "-i", "{number_text_jsonl}", "-o", "{tmp}/p.csv"], 2, "row 2", "float"),
    C("predict-data-before-model", [*PRED, "-i", "{null_text_jsonl}", "-o", "{tmp}/p.csv"], 2, "row 2",
      setup=_truncate("{run}/best/model.safetensors")),
    C("predict-parquet-corrupt", [*PRED, "-i", "{bad_parquet}", "-o", "{tmp}/p.csv"], 2, "bad.parquet"),
    C("predict-json-scalar", [*PRED, "-i", "{scalar_json}", "-o", "{tmp}/p.csv"], 2, "scalar.json"),
    C("predict-header-twice", [*PRED, "-i", "{dup_header_tsv}", "-o", "{tmp}/p.csv"], 2,
      "column `sentence` appears twice", "dup_header.tsv", left=["{tmp}/p.csv"]),
    C("predict-json-key-twice", [*PRED, "-i", "{dup_key_jsonl}", "-o", "{tmp}/p.csv"], 2, "`sentence` appears twice"),
    C("predict-parquet-mixed-types", [*PRED, "-i", "{mixed_id_jsonl}", "-o", "{tmp}/p.parquet"], 2, "column `id`",
      "row 2", "Parquet", left=["{tmp}/p.parquet"]),
    C("predict-column-missing", [*PRED, "-i", "{good_tsv}", "-o", "{tmp}/p.csv", "-c", "text"], 2, "missing column `text`"),
    C("predict-input-missing", [*PRED, "-i", "{tmp}/none.tsv", "-o", "{tmp}/p.csv"], 2, "not found", "none.tsv"),
    C("predict-input-dir", [*PRED, "-i", "{tmp}", "-o", "{tmp}/p.csv"], 2, "is a directory"),
    C("predict-input-fifo", [*PRED, "-i", "{fifo}", "-o", "{tmp}/p.csv"], 2, "fifo.tsv", "not a regular file"),
    C("predict-out-is-input", [*PRED, "-i", "{good_tsv}", "-o", "{good_tsv}"], 2, "is the input file"),
    C("predict-out-bad-suffix", [*PRED, "-i", "{good_tsv}", "-o", "{tmp}/p.xlsx"], 2, "p.xlsx"),
    C("predict-out-under-file", [*PRED, "-i", "{good_tsv}", "-o", "{afile}/p.csv"], 5, "afile"),
    C("predict-out-is-dir", [*PRED, "-i", "{good_tsv}", "-o", "{tmp}/d.csv"], 5, "d.csv", "folder",
      setup=lambda c: (c.tmp / "d.csv").mkdir()),
    C("predict-out-read-only", [*PRED, "-i", "{good_tsv}", "-o", "{ro}/p.csv"], 5, "read-only", left=["{ro}/p.csv"]),
    C("predict-disk-full", [*PRED, "-i", "{good_tsv}", "-o", "{tmp}/p.csv"], 5, "no space left", "{tmp}/p.csv",
      left=["{tmp}/p.csv"], patch=_full_disk_at("finetune_cli.data.table_io", "_cell")),
    C("predict-model-hidden-size", ["predict", "{model_copy}", "-i", "{good_tsv}", "-c", "sentence", "-o",
                                    "{tmp}/p.csv", "-q"], 2, "config.json", "`hidden_size` is -5",
      setup=_set_config("hidden_size", -5), left=["{tmp}/p.csv"]),
    # ---- embed --------------------------------------------------------------------------------
    C("embed-latin1", [*EMBED, "{latin1_txt}", "-o", "{tmp}/e.npy"], 2, "latin1.txt", "byte", left=["{tmp}/e.npy"]),
    C("embed-out-under-file", [*EMBED, "{sentences_txt}", "-o", "{afile}/e.npy"], 5, "afile"),
    C("embed-out-read-only", [*EMBED, "{sentences_txt}", "-o", "{ro}/e.npy"], 5, "read-only", left=["{ro}/e.npy"]),
    C("embed-out-is-dir", [*EMBED, "{sentences_txt}", "-o", "{adir}"], 5, "adir.npy"),
    C("embed-json-scalar", [*EMBED, "{scalar_json}", "-o", "{tmp}/e.npy"], 2, "scalar.json"),
    C("embed-parquet-corrupt", [*EMBED, "{bad_parquet}", "-o", "{tmp}/e.npy"], 2, "bad.parquet"),
    C("embed-text-null", [*EMBED, "{text_null_jsonl}", "-o", "{tmp}/e.npy"], 2, "row 2", "text_null.jsonl"),
    C("embed-text-number", [*EMBED, "{text_number_jsonl}", "-o", "{tmp}/e.npy"], 2, "row 2", "text_number.jsonl"),
    C("embed-batch-size-zero", [*EMBED, "{sentences_txt}", "-o", "{tmp}/e.npy", "--batch-size", "0"], 2,
      "--batch-size"),
    C("embed-max-length-over-model", [*EMBED, "{sentences_txt}", "-o", "{tmp}/e.npy", "--max-length", "4096"], 2,
      "--max-length", "128"),
    C("embed-model-truncated", [*EMBED, "{sentences_txt}", "-o", "{tmp}/e.npy"], 2, "model.safetensors",
      setup=_truncate("{run}/best/model.safetensors"), left=["{tmp}/e.npy"]),
    C("embed-bad-suffix", [*EMBED, "{sentences_txt}", "-o", "{tmp}/e.csv"], 2, "e.csv"),
    C("embed-input-missing", [*EMBED, "{tmp}/none.txt", "-o", "{tmp}/e.npy"], 2, "none.txt"),
    C("embed-jsonl-line-3", [*EMBED, "{line3_jsonl}", "-c", "sentence", "-o", "{tmp}/e.npy"], 2, "line 3"),
    C("embed-text-list", [*EMBED, "{list_text_jsonl}", "-c", "sentence", "-o", "{tmp}/e.npy"], 2, "row 2", "list"),
    C("embed-header-twice", [*EMBED, "{dup_header_tsv}", "-c", "sentence", "-o", "{tmp}/e.npy"], 2,
      "appears twice", left=["{tmp}/e.npy"]),
    C("embed-data-before-model", [*EMBED, "{text_null_jsonl}", "-o", "{tmp}/e.npy"], 2, "row 2",
      setup=_truncate("{run}/best/model.safetensors")),
    C("embed-input-dir", [*EMBED, "{tmp}", "-o", "{tmp}/e.npy"], 2, "is a directory"),
    C("embed-input-fifo", [*EMBED, "{fifo}", "-o", "{tmp}/e.npy"], 2, "not a regular file"),
    C("embed-disk-full", [*EMBED, "{sentences_txt}", "-o", "{tmp}/e.npy"], 5, "no space left", "{tmp}",
      left=["{tmp}/e.npy", "{tmp}/e.ids.npy"], patch=_full_disk_at("finetune_cli.pipelines.embed", "_npy_header")),
    C("embed-modules-json-not-list", ["embed", "{model_copy}", "{sentences_txt}", "-o", "{tmp}/e.npy", "-q"], 2,
      "modules.json", "must hold a list", setup=_write("{model_copy}/modules.json", '{"a": 1}')),
    C("embed-modules-json-malformed", ["embed", "{model_copy}", "{sentences_txt}", "-o", "{tmp}/e.npy", "-q"], 2,
      "modules.json", "not valid JSON", setup=_write("{model_copy}/modules.json", '[{"type": "x"')),
    C("embed-config-not-object", ["embed", "{model_copy}", "{sentences_txt}", "-o", "{tmp}/e.npy", "-q"], 2,
      "config.json", "must hold an object", setup=_write("{model_copy}/config.json", "[1]")),
    C("embed-precision-fp16-cpu", [*EMBED, "{sentences_txt}", "-o", "{tmp}/e.npy", "--precision", "fp16"], 2,
      "--precision fp16", "GPU", left=["{tmp}/e.npy"]),
    # ---- augment ------------------------------------------------------------------------------
    C("augment-latin1", [*AUG, "-i", "{latin1_tsv}", "-o", "{tmp}/a.tsv"], 2, "latin1.tsv", "byte",
      left=["{tmp}/a.tsv"]),
    C("augment-out-under-file", [*AUG, "-i", "{good_tsv}", "-o", "{afile}/a.tsv"], 5, "afile"),
    C("augment-out-read-only", [*AUG, "-i", "{good_tsv}", "-o", "{ro}/a.tsv"], 5, "read-only", left=["{ro}/a.tsv"]),
    C("augment-out-is-dir", [*AUG, "-i", "{good_tsv}", "-o", "{tmp}/d.tsv"], 5, "d.tsv",
      setup=lambda c: (c.tmp / "d.tsv").mkdir()),
    C("augment-json-scalar", [*AUG, "-i", "{scalar_json}", "-o", "{tmp}/a.jsonl", "-c", "sentence"], 2,
      "scalar.json"),
    C("augment-parquet-corrupt", [*AUG, "-i", "{bad_parquet}", "-o", "{tmp}/a.jsonl", "-c", "sentence"], 2,
      "bad.parquet"),
    C("augment-text-null", [*AUG, "-i", "{null_text_jsonl}", "-o", "{tmp}/a.jsonl", "-c", "sentence"], 2,
      "row 2", "null_text.jsonl"),
    C("augment-prob-out-of-range", ["augment", "--delete-words", "1.5", "-i", "{good_tsv}", "-o", "{tmp}/a.tsv",
                                    "-q"], 2, "--delete-words"),
    C("augment-input-missing", [*AUG, "-i", "{tmp}/none.tsv", "-o", "{tmp}/a.tsv"], 2, "none.tsv"),
    C("augment-header-twice", [*AUG, "-i", "{dup_header_tsv}", "-o", "{tmp}/a.tsv"], 2, "appears twice",
      left=["{tmp}/a.tsv"]),
    C("augment-text-list", [*AUG, "-i", "{list_text_jsonl}", "-o", "{tmp}/a.jsonl", "-c", "sentence"], 2, "row 2",
      "list"),
    C("augment-input-dir", [*AUG, "-i", "{tmp}", "-o", "{tmp}/a.tsv", "-c", "sentence"], 2, "is a directory"),
    C("augment-parquet-mixed-types", [*AUG, "-i", "{mixed_id_jsonl}", "-o", "{tmp}/a.parquet", "-c", "sentence"], 2,
      "column `id`", "row 2", "Parquet", left=["{tmp}/a.parquet", "{tmp}/a.parquet.parts"]),
    # ---- probe --------------------------------------------------------------------------------
    C("probe-training-recipe", ["probe", "sequential", "-r", "quickstart", "-q"], 2, "quickstart"),
    C("probe-epochs-inf", [*PROBE, "train.epochs=.inf"], 2, "train.epochs"),
    C("probe-seed-huge", [*PROBE, f"train.seed={SEED_HUGE}"], 2, "train.seed"),
    C("probe-unknown-key", [*PROBE, "probe.sequense=[a]"], 2, "probe.sequense"),
    C("probe-cycles-zero", ["probe", "retention", "-r", "probe_sequential", "--cycles", "0"], 2, "--cycles"),
    C("probe-out-under-file", [*PROBE, "output.dir={afile}/x"], 5, "afile"),
    C("probe-task-header-twice", [*PROBE, "~probe.tasks.sst2.data.dataset", "probe.tasks.sst2.data.train={dup_header_tsv}",
                                  "probe.tasks.sst2.data.eval={dup_header_tsv}", "probe.tasks.sst2.data.columns.text=sentence"],
      2, "appears twice", "dup_header.tsv"),
    # ---- export -------------------------------------------------------------------------------
    C("export-out-is-file", [*EXPORT, "{afile}"], 5, "afile", "is a file"),
    C("export-out-under-file", [*EXPORT, "{afile}/m"], 5, "afile"),
    C("export-out-read-only", [*EXPORT, "{ro}/m"], 5, "read-only", left=["{ro}/m"]),
    C("export-out-not-empty", [*EXPORT, "{tmp}/full"], 2, "not empty", "--overwrite",
      setup=_write("{tmp}/full/keep.txt", "mine\n")),
    # ---- report -------------------------------------------------------------------------------
    C("report-summary-list", REPORT, 2, "summary.json", setup=_write("{run}/summary.json", "[1, 2]\n")),
    C("report-summary-truncated", REPORT, 2, "summary.json", setup=_truncate("{run}/summary.json")),
    C("report-recipe-list", REPORT, 2, "recipe.yaml", setup=_write("{run}/recipe.yaml", "- a\n- b\n")),
    C("report-metric-string", REPORT, 2, "eval_metrics.json", "accuracy",
      setup=_json_edit("{run}/best/eval_metrics.json", lambda d: {**d, "accuracy": "high"})),
    C("report-eval-json-shape", REPORT, 2, "eval.json", setup=_write("{run}/eval.json", '{"metrics": [1, 2]}')),
    C("report-seed-not-integer", REPORT, 2, "seed", setup=_json_edit("{run}/summary.json", lambda d: {**d, "seed": "x"})),
    C("report-final-eval-shape", REPORT, 2, "summary.json",
      setup=_both(lambda c: (Path(c["run"]) / "best" / "eval_metrics.json").unlink(),
                  _json_edit("{run}/summary.json", lambda d: {**d, "final_eval": 3}))),
    C("report-plot-under-file", ["report", "{run}", "--plot", "{afile}/r.png"], 5, "afile"),
    C("report-plot-is-dir", ["report", "{run}", "--plot", "{tmp}"], 5, "{tmp}"),
    C("report-missing-run", ["report", "{tmp}/none"], 2, "none"),
    C("report-compare-garbage", [*REPORT, "--compare", "a"], 2, "--compare"),
    # ---- recipes ------------------------------------------------------------------------------
    C("recipes-validate-scalar", ["recipes", "validate", "{scalar_yaml}"], 2, "scalar.yaml"),
    C("recipes-validate-latin1", ["recipes", "validate", "{latin1_yaml}"], 2, "latin1.yaml", "UTF-8"),
    C("recipes-validate-epochs-inf", ["recipes", "validate", "quickstart", "train.epochs=.inf"], 2, "train.epochs"),
    C("recipes-validate-head-normalize-native", ["recipes", "validate", "quickstart", "model.head=native",
                                                 "model.head_normalize=true"], 2, "model.head_normalize", "pooled"),
    C("recipes-validate-scl-crop-zero", ["recipes", "validate", "scl", "objective.crop=0"], 2, "crop", "> 0.0"),
    C("recipes-validate-seed-huge", ["recipes", "validate", "quickstart", f"train.seed={SEED_HUGE}"], 2,
      "train.seed"),
    C("recipes-validate-metric", ["recipes", "validate", "quickstart", "train.metric=acc"], 2, "train.metric"),
    C("recipes-validate-encoding", ["recipes", "validate", "quickstart", "data.encoding=klingon"], 2,
      "data.encoding"),
    C("recipes-validate-lr-nan", ["recipes", "validate", "quickstart", "train.lr=.nan"], 2, "train.lr"),
    C("recipes-validate-dir", ["recipes", "validate", "{tmp}"], 2, "directory"),
    C("recipes-validate-unknown-option", ["recipes", "validate", "quickstart", "--nope"], 2, "--nope"),
    C("recipes-show-missing", ["recipes", "show", "nosuch"], 2, "nosuch"),
    C("recipes-validate-drop-unknown", ["recipes", "validate", "quickstart", "~data.colums"], 2, "~data.colums",
      "did you mean `data.columns`"),
    # ---- outputs apart from their inputs: nothing a command reads is replaced --------------------
    C("export-onnx-out-is-run", [*ONNX, "{run}", "--overwrite"], 2, "is the run directory", kept=KEEP_RUN),
    C("export-out-is-model-folder", [*ONNX, "{run}/best", "--overwrite"], 2, "is the model folder", kept=KEEP_RUN),
    C("export-out-inside-run", [*ONNX, "{run}/onnx"], 2, "lies inside the run directory", left=["{run}/onnx"],
      kept=KEEP_RUN),
    C("export-out-holds-run", [*ONNX, "{tmp}/runs", "--overwrite"], 2, "holds the run directory", kept=KEEP_RUN),
    C("export-out-is-cwd", [*ONNX, ".", "--overwrite"], 2, "is the current folder", cwd="{tmp}/here",
      setup=_write("{tmp}/here/keep.txt", "mine\n"), kept=["{tmp}/here/keep.txt", *KEEP_RUN]),
    C("export-merge-out-is-base", ["export", "{adapter}", "--merge", "-q", "-o", "{model_copy}", "--overwrite"], 2,
      "is the adapter's base model", setup=_base_of_adapter("{model_copy}"),
      kept=["{model_copy}/config.json", "{model_copy}/model.safetensors"]),
    C("train-output-is-model", [*TRAIN, "model.name={model_copy}", "output.dir={tmp}", "output.name=model",
                                "--overwrite"], 2, "is the model folder", kept=["{tmp}/model/config.json",
                                                                                "{tmp}/model/model.safetensors"]),
    C("train-output-holds-data", [*TRAIN, "data.train={good_tsv}", "output.dir={tmp}", "output.name=data",
                                  "--overwrite"], 2, "holds the training data", kept=["{good_tsv}"]),
    C("train-output-is-cwd", [*TRAIN, "output.dir={tmp}", "output.name=here", "--overwrite"], 2,
      "is the current folder", cwd="{tmp}/here", setup=_write("{tmp}/here/keep.txt", "mine\n"),
      kept=["{tmp}/here/keep.txt"], left=["{tmp}/here/.finetune.lock"]),
    C("predict-out-in-model-folder", [*PRED, "-i", "{good_tsv}", "-o", "{run}/best/config.json"], 2,
      "lies inside the model folder", kept=KEEP_RUN),
    C("embed-out-in-model-folder", [*EMBED, "{sentences_txt}", "-o", "{run}/best/e.npy"], 2,
      "lies inside the model folder", left=["{run}/best/e.npy"], kept=KEEP_RUN),
    C("augment-work-folder-holds-input", [*AUG, "-i", "{tmp}/a.tsv.parts/in.tsv", "-o", "{tmp}/a.tsv"], 2,
      "work folder", "holds the input file", setup=_write("{tmp}/a.tsv.parts/in.tsv", "sentence\tlabel\ngood\tpositive\n"),
      kept=["{tmp}/a.tsv.parts/in.tsv"], left=["{tmp}/a.tsv"]),
    C("probe-out-is-model", [*PROBE, "model.name={model_copy}", "output.dir={tmp}", "output.name=model",
                             "--overwrite"], 2, "is the model folder", kept=["{tmp}/model/config.json"]),
    # ---- output.name: one folder name under output.dir ----------------------------------------
    C("train-output-name-parent", [*TRAIN, "output.name=../escape", "--overwrite"], 2, "output.name",
      "one folder name", setup=_write("{tmp}/escape/keep.txt", "mine\n"), kept=["{tmp}/escape/keep.txt"]),
    C("train-output-name-absolute", [*TRAIN, "output.name={tmp}/escape", "--overwrite"], 2, "output.name",
      "one folder name", setup=_write("{tmp}/escape/keep.txt", "mine\n"), kept=["{tmp}/escape/keep.txt"]),
    C("train-output-name-from-file", ["train", "-r", "{tmp}/r.yaml", "model.name={model}", *RUN_OVERRIDES[:-1],
                                      "output.dir={tmp}/runs", "--overwrite", "--device", "cpu", "-q"], 2,
      "output.name", "r.yaml", "one folder name",
      setup=_both(_write("{tmp}/r.yaml", "output:\n  name: ../escape\n"), _write("{tmp}/escape/keep.txt", "mine\n")),
      kept=["{tmp}/escape/keep.txt"]),
    C("recipes-validate-output-name-dotdot", ["recipes", "validate", "quickstart", "output.name=.."], 2,
      "output.name", "one folder name"),
    # ---- the lock, figures/ and push: write and read inside the folder only --------------------
    C("train-lock-hard-link", TRAIN, 2, ".finetune.lock", "hard link",
      setup=_hard_link("{tmp}/runs/t/.finetune.lock", "{tmp}/precious.txt"), kept=["{tmp}/precious.txt"],
      left=["{tmp}/runs/t/recipe.yaml"]),
    C("train-lock-fifo", TRAIN, 2, ".finetune.lock", "not a regular file",
      setup=lambda c: ((c.tmp / "runs" / "t").mkdir(parents=True), os.mkfifo(c.tmp / "runs" / "t" / ".finetune.lock")),
      left=["{tmp}/runs/t/recipe.yaml"]),
    C("push-symlink-outside", ["push", "{run}", "me/model", "-q"], 2, "best/token", "symbolic link",
      setup=_link("{run}/best/token", "{tmp}/secret/token"), patch=_upload_nothing),
    C("push-symlinked-folder", ["push", "{run}", "me/model", "--dry-run", "-q"], 2, "best/home", "symbolic link",
      setup=_link("{run}/best/home", "{tmp}"), patch=_upload_nothing),
    # ---- bounded rows, headers and error lines -------------------------------------------------
    C("predict-header-huge", [*PRED, "-i", "{long_header_tsv}", "-o", "{tmp}/p.csv"], 2, "line 1",
      "long_header.tsv", "1,048,576", left=["{tmp}/p.csv"]),
    C("predict-row-huge", [*PRED, "-i", "{long_row_tsv}", "-o", "{tmp}/p.csv"], 2, "line 3", "long_row.tsv",
      left=["{tmp}/p.csv"]),
    C("embed-line-huge", [*EMBED, "{long_line_txt}", "-o", "{tmp}/e.npy"], 2, "line 2", "long_line.txt",
      left=["{tmp}/e.npy"]),
    C("train-row-huge", [*TRAIN, "data.train={long_row_tsv}"], 2, "line 3", "long_row.tsv", left=NOT_MODEL),
    C("augment-row-huge", [*AUG, "-i", "{long_row_tsv}", "-o", "{tmp}/a.tsv"], 2, "line 3", left=["{tmp}/a.tsv"]),
    # ---- ONNX and LoRA folders ---------------------------------------------------------------
    C("export-onnx-pooled-fake-onnx-input", ["export", "{model_copy}", "--format", "onnx", "-o", "{tmp}/o", "-q"], 2,
      "is an ONNX folder already", setup=_write("{model_copy}/model.onnx", b"not a graph"), left=["{tmp}/o"]),
    C("predict-onnx-embedding-graph-as-classifier", ["predict", "{onnx_embed}", "-i", "{good_tsv}", "-c", "sentence",
                                                    "-o", "{tmp}/p.csv", "-q"], 2, "computes embeddings", "logits",
      setup=_both(_copy("{run}/best/config.json", "{onnx_embed}/config.json"),
                  _copy("{run}/best/finetune_model.json", "{onnx_embed}/finetune_model.json")), left=["{tmp}/p.csv"]),
    C("embed-onnx-no-tokenizer", ["embed", "{onnx_embed}", "{sentences_txt}", "-o", "{tmp}/e.npy", "-q"], 2,
      "no tokenizer files", setup=_delete(*TOKENIZER), left=["{tmp}/e.npy"]),
    C("embed-onnx-no-config", ["embed", "{onnx_embed}", "{sentences_txt}", "-o", "{tmp}/e.npy", "-q"], 2,
      "has no config.json", setup=_delete("{onnx_embed}/config.json"), left=["{tmp}/e.npy"]),
    C("train-model-is-onnx-folder", [*TRAIN, "model.name={onnx_embed}"], 2, "is an ONNX folder", left=NOT_MODEL),
    C("train-model-is-adapter-folder", [*TRAIN, "model.name={adapter}"], 2, "is a LoRA adapter folder", "--merge",
      left=NOT_MODEL),
    C("predict-adapter-rank-disagrees", ["predict", "{adapter}", "-i", "{good_tsv}", "-c", "sentence", "-o",
                                         "{tmp}/p.csv", "-q"], 2, "adapter_model.safetensors", "does not match",
      setup=_json_edit("{adapter}/adapter_config.json", lambda d: {**d, "r": d["r"] * 2}), left=["{tmp}/p.csv"]),
    C("predict-adapter-base-replaced", ["predict", "{adapter}", "-i", "{good_tsv}", "-c", "sentence", "-o",
                                        "{tmp}/p.csv", "-q"], 2, "base model", "hidden_size 48", "hidden_size 32",
      setup=_base_of_adapter("{wide_model}"), left=["{tmp}/p.csv"]),
    # ---- symbolic link loops: one line ---------------------------------------------------------
    C("predict-input-loop", [*PRED, "-i", "{loop}", "-o", "{tmp}/p.csv"], 2, "loop.tsv", left=["{tmp}/p.csv"]),
    C("augment-input-loop", [*AUG, "-i", "{loop}", "-o", "{tmp}/a.tsv"], 2, "loop.tsv", left=["{tmp}/a.tsv"]),
    C("report-run-loop", ["report", "{loop}", "--no-plot"], 2, "loop.tsv"),
    C("export-onnx-disk-full", [*ONNX, "{tmp}/o"], 5, "no space left", "{tmp}/o", left=["{tmp}/o"], kept=KEEP_RUN,
      patch=_full_disk_at("finetune_cli.models.onnx", "export_onnx")),
    # ---- misleading lines: name the key, the rule and the fix ---------------------------------
    C("predict-gzip", [*PRED, "-i", "{gzip_tsv}", "-o", "{tmp}/p.csv"], 2, "rows.tsv", "gzip-compressed", "gunzip",
      left=["{tmp}/p.csv"]),
    C("train-gzip", [*TRAIN, "data.train={gzip_tsv}"], 2, "rows.tsv", "gzip-compressed", left=NOT_MODEL),
    C("predict-no-extension", [*PRED, "-i", "{no_ext}", "-o", "{tmp}/p.csv"], 2, "cannot tell the format",
      "name it .csv", left=["{tmp}/p.csv"]),
    C("train-max-length-huge", [*TRAIN, "model.max_length=100000"], 2, "model.max_length", "position limit", "128",
      left=NOT_MODEL),
    C("export-out-is-cwd-elsewhere", [*ONNX, "{tmp}/here/..", "--overwrite"], 2, "holds the", cwd="{tmp}/here",
      kept=KEEP_RUN),
    C("recipes-validate-refit-r4f", ["recipes", "validate", "quickstart", "train.refit_head=true",
                                     "objective.name=r4f"], 2, "train.refit_head", "r4f", "spectrally"),
    C("recipes-validate-refit-regression", ["recipes", "validate", "quickstart", "train.refit_head=true",
                                            "model.problem_type=regression"], 2, "train.refit_head", "regression"),
    # ---- recipe sub-keys name the key and its rule ---------------------------------------------
    C("recipes-validate-lora-r-zero", ["recipes", "validate", "quickstart", "model.lora.r=0"], 2, "`model.lora.r`",
      "> 0"),
    C("recipes-validate-lora-alpha-nan", ["recipes", "validate", "quickstart", "model.lora.alpha=.nan"], 2,
      "`model.lora.alpha`", "finite"),
    C("recipes-validate-lora-dropout-one", ["recipes", "validate", "quickstart", "model.lora.dropout=1.0"], 2,
      "`model.lora.dropout`", "< 1.0"),
    C("recipes-validate-lora-targets-string", ["recipes", "validate", "quickstart", "model.lora.target_modules=query"],
      2, "`model.lora.target_modules`", "list"),
    C("recipes-validate-lora-typo", ["recipes", "validate", "quickstart", "model.lora.rr=4"], 2, "`model.lora.rr`",
      "did you mean `model.lora.r`"),
]


# ---- the run every case copies -----------------------------------------------------------------

@pytest.fixture(scope="module")
def finished_run(tiny_model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bad-input-run")
    res = runner.invoke(app, ["train", "-r", "quickstart", f"model.name={tiny_model_dir}", *RUN_OVERRIDES,
                              f"output.dir={out}", "--device", "cpu", "-q"])
    assert res.exit_code == 0, res.output
    run = out / "t"
    assert (run / "checkpoint-1").is_dir() and (run / "checkpoint-2").is_dir() and (run / "best").is_dir()
    return run


@pytest.fixture(scope="module")
def lora_adapter(tiny_model_dir, tmp_path_factory) -> Path:
    """The best/ folder of a one-step LoRA run of the tiny model (a classifier's adapter folder)."""
    out = tmp_path_factory.mktemp("bad-input-lora")
    res = runner.invoke(app, ["train", "-r", "quickstart", f"model.name={tiny_model_dir}", *RUN_OVERRIDES,
                              "train.max_steps=1", "model.lora.r=4", f"output.dir={out}", "--device", "cpu", "-q"])
    assert res.exit_code == 0, res.output
    return out / "t" / "best"


@pytest.fixture(scope="module")
def onnx_embedding(tiny_model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bad-input-onnx") / "onnx"
    res = runner.invoke(app, ["export", str(tiny_model_dir), "--format", "onnx", "-o", str(out), "-q"])
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture(scope="module")
def wide_model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    from transformers import BertConfig, BertModel

    out = tmp_path_factory.mktemp("wide-bert")
    BertModel(BertConfig(vocab_size=30522, hidden_size=48, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=128)).save_pretrained(out)
    for f in tiny_model_dir.iterdir():
        if f.name.startswith(("tokenizer", "vocab", "special")):
            shutil.copy2(f, out / f.name)
    return out


def _snapshot(paths: list[str], ctx: Ctx) -> dict[str, Optional[bytes]]:
    """What each kept path holds now (a file's bytes; None for a folder)."""
    out: dict[str, Optional[bytes]] = {}
    for rel in paths:
        p = Path(fill(rel, ctx))
        assert p.exists(), f"kept path {p} missing before the command"
        out[str(p)] = p.read_bytes() if p.is_file() else None
    return out


@contextlib.contextmanager
def read_only_as_root(ctx: Ctx):
    """Root writes into 0555 folders anyway: then make creating files under ``ro`` fail as a
    read-only file system would (the tool creates every output through mkstemp/mkdtemp/open)."""
    if "ro" not in ctx or os.geteuid() != 0:
        yield
        return
    ro = ctx["ro"]
    real_mkstemp, real_mkdtemp, real_open, real_mkdir = tempfile.mkstemp, tempfile.mkdtemp, os.open, os.mkdir

    def under(p: Any) -> bool:
        return p is not None and os.path.abspath(os.fspath(p)).startswith(ro)

    def refuse(p: Any):
        raise OSError(errno.EROFS, "Read-only file system", os.fspath(p))

    def mkstemp(*a, **k):
        if under(k.get("dir")):
            refuse(k["dir"])
        return real_mkstemp(*a, **k)

    def mkdtemp(*a, **k):
        if under(k.get("dir")):
            refuse(k["dir"])
        return real_mkdtemp(*a, **k)

    def os_open(p, flags, *a, **k):
        if under(p) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            refuse(p)
        return real_open(p, flags, *a, **k)

    def mkdir(p, *a, **k):
        if under(p):
            refuse(p)
        return real_mkdir(p, *a, **k)

    import builtins
    real_builtin_open = builtins.open

    def b_open(file, mode="r", *a, **k):
        if isinstance(file, (str, os.PathLike)) and under(file) and any(c in mode for c in "wax+"):
            refuse(file)
        return real_builtin_open(file, mode, *a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tempfile, "mkstemp", mkstemp)
        mp.setattr(tempfile, "mkdtemp", mkdtemp)
        mp.setattr(os, "open", os_open)
        mp.setattr(os, "mkdir", mkdir)
        mp.setattr(builtins, "open", b_open)
        yield


@pytest.mark.parametrize("case", CASES)
def test_bad_input(case: Case, tmp_path, tiny_model_dir, finished_run, request):
    ctx = Ctx(tmp_path, tiny_model_dir, finished_run, request)
    if case.setup is not None:
        case.setup(ctx)
    argv = [fill(a, ctx) for a in case.argv]
    before = _snapshot(case.kept, ctx)
    with read_only_as_root(ctx), pytest.MonkeyPatch.context() as mp:
        if case.cwd is not None:
            Path(fill(case.cwd, ctx)).mkdir(parents=True, exist_ok=True)
            mp.chdir(fill(case.cwd, ctx))
        if case.patch is not None:
            case.patch(mp)
        res = runner.invoke(app, argv)
    for p in (tmp_path / "ro",):
        if p.exists():
            p.chmod(0o755)
    traceback = res.exception is not None and not isinstance(res.exception, SystemExit)
    if CENSUS:
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        with open(CENSUS, "a") as f:
            f.write(json.dumps({"id": case.id, "traceback": traceback, "exit_code": res.exit_code,
                                "exception": type(res.exception).__name__ if traceback else None,
                                "stderr_lines": len(lines), "last": lines[-1][:200] if lines else ""}) + "\n")
        return
    assert not traceback, f"{case.id}: {type(res.exception).__name__}: {res.exception}"
    assert "Traceback" not in res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], res.stderr
    if "-q" in argv:  # quiet: nothing but the error line
        assert len(lines) == 1, res.stderr
    for e in case.expect:
        assert fill(e, ctx) in errors[0], (e, errors[0])
    assert res.exit_code == case.code, (res.exit_code, errors[0])
    for rel in case.left:
        assert not Path(fill(rel, ctx)).exists(), rel
    for path, content in before.items():  # nothing the command reads was deleted or changed
        assert Path(path).exists(), f"{path} was deleted"
        assert content is None or Path(path).read_bytes() == content, f"{path} was changed"
    # writers leave nothing a rerun would trust: no half-written summary or model files
    for p in tmp_path.rglob("*"):
        assert not (p.name.endswith(".tmp") or ".tmp." in p.name), p


def test_a_parameter_at_its_default_is_the_same_run(tmp_path, tiny_model_dir, finished_run):
    """The finished run left `objective.label_smoothing` out; naming its default is the same run
    (complete: nothing to do), and so is resuming its checkpoint into another folder."""
    run = shutil.copytree(finished_run, tmp_path / "runs" / "t")
    argv = [fill(a, Ctx(tmp_path, tiny_model_dir, finished_run)) for a in TRAIN]
    res = runner.invoke(app, [*argv, "objective.label_smoothing=0.0"])
    assert res.exit_code == 0 and not res.stderr.strip(), res.output
    assert "label_smoothing" not in (run / "recipe.yaml").read_text()


def test_table_size():
    ids = [c.values[0].id for c in CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 60
    commands = {c.values[0].argv[0] for c in CASES}
    assert commands == {"train", "eval", "predict", "embed", "augment", "export", "probe", "report", "recipes", "push"}


def test_outputs_follow_the_umask(tmp_path):
    from finetune_cli.fsutil import atomic_dir, atomic_write_text

    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "f.json", "{}")
        with atomic_dir(tmp_path / "d") as d:
            (d / "x").write_text("x")
    finally:
        os.umask(old)
    assert (tmp_path / "f.json").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "d").stat().st_mode & 0o777 == 0o755


def test_token_cache_is_never_unpickled(tmp_path, tiny_model_dir, monkeypatch):
    """A crafted pickle in place of a cache entry is not executed: it is not a valid .npz of integer
    arrays, so it is recomputed (and replaced by one)."""
    import pickle

    from transformers import AutoTokenizer

    from finetune_cli.data import encode as E
    from finetune_cli.data.sources import Table

    monkeypatch.setenv("FINETUNE_CACHE", str(tmp_path / "cache"))
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    t = Table({"text": ["a cat", "the dog ran"]}, "<t>")
    first = E.encode_table(t, tok, 16, ("text",), joint=False)
    (entry,) = list(E.cache_dir().glob("*.npz"))
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    entry.write_bytes(pickle.dumps(Evil()))
    again = E.encode_table(t, tok, 16, ("text",), joint=False)
    assert not marker.exists()
    assert again.views == first.views
    with np_load(entry) as z:  # rewritten as plain arrays
        assert all(z[k].dtype.kind in "iu" for k in z.files)


def np_load(p):
    import numpy as np

    return np.load(p, allow_pickle=False)


def test_a_figures_link_is_replaced_not_written_through(tmp_path, tiny_model_dir):
    """A run folder's ``figures/`` that is a symbolic link: training writes ``curves.png`` into a real
    ``figures/`` inside the run, and the folder the link pointed to stays empty."""
    pytest.importorskip("matplotlib")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    argv = ["train", "-r", "quickstart", f"model.name={tiny_model_dir}", *RUN_OVERRIDES,
            f"output.dir={tmp_path / 'runs'}", "--device", "cpu", "-q"]
    assert runner.invoke(app, argv).exit_code == 0
    run = tmp_path / "runs" / "t"  # cut before its end (it resumes), its figures/ a link
    (run / "summary.json").unlink()
    shutil.rmtree(run / "final")
    shutil.rmtree(run / "figures")
    (run / "figures").symlink_to(elsewhere)
    res = runner.invoke(app, argv)
    assert res.exit_code == 0, res.output
    assert not (run / "figures").is_symlink() and (run / "figures" / "curves.png").is_file()
    assert list(elsewhere.iterdir()) == []


def test_a_warmup_longer_than_the_run_is_named(tmp_path, tiny_model_dir):
    """``train.warmup_steps`` beyond the last step: a warning naming the key, the run's steps and the
    fraction of ``train.lr`` reached (a warning, not a refusal: a short trial of a long recipe is fair)."""
    res = runner.invoke(app, ["train", "-r", "quickstart", f"model.name={tiny_model_dir}", *RUN_OVERRIDES,
                              "train.warmup_steps=100", f"output.dir={tmp_path / 'runs'}",
                              "--device", "cpu", "-q"])
    assert res.exit_code == 0, res.output
    warn = [ln for ln in res.stderr.splitlines() if "train.warmup_steps" in ln]
    assert len(warn) == 1 and "100" in warn[0] and "2 steps" in warn[0] and "2%" in warn[0], res.stderr
    ok = runner.invoke(app, ["train", "-r", "quickstart", f"model.name={tiny_model_dir}", *RUN_OVERRIDES,
                             "train.warmup_steps=2", "output.name=u", f"output.dir={tmp_path / 'runs'}",
                             "--device", "cpu", "-q"])
    assert ok.exit_code == 0 and "warmup" not in ok.stderr, ok.stderr


def test_check_apart_names_the_closest_relation_through_links(tmp_path):
    """The one check every writer runs: is / holds / lies inside an input, a second name (a link)
    caught too, the closest relation named, a link loop no error of its own."""
    from finetune_cli.errors import FinetuneError
    from finetune_cli.fsutil import check_apart

    run = tmp_path / "runs" / "t"
    (run / "best").mkdir(parents=True)
    (tmp_path / "alias").symlink_to(run)
    inputs = [("run directory", run), ("model folder", run / "best")]
    for out, words in ((run, "is the run directory"), (run / "best", "is the model folder"),
                       (tmp_path / "alias" / "best", "is the model folder"), (tmp_path / "runs", "holds the run"),
                       (run / "x", "lies inside the run directory"), (tmp_path / "alias", "is the run directory")):
        with pytest.raises(FinetuneError, match=words):
            check_apart(out, inputs)
    for out in (tmp_path / "other", tmp_path / "runs" / "u", tmp_path / "runs" / "t2"):
        check_apart(out, inputs)  # apart: nothing raised
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    check_apart(tmp_path / "loop", inputs)
    with pytest.raises(FinetuneError, match="is the current folder"):
        check_apart(tmp_path, [], around=[("current folder", tmp_path)])
    check_apart(tmp_path / "sub", [], around=[("current folder", tmp_path)])  # inside the current folder: fine
