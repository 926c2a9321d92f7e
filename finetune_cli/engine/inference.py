"""Batched, length-sorted forward passes for evaluation and embedding, and the one inference
session (:func:`open_session`) that ``eval``, ``predict`` and ``embed`` run a model through.

Inside :func:`sharded` (the trainer's evaluation on several processes) every rank runs a share of
the batches and the outputs are gathered, so each rank returns the whole result. The batches are
those of one process (the same length-sorted cut, dealt round-robin), so every example is computed
in the same batch, with the same padding, as in a one-process run: the outputs, and the metrics
computed from them, are bit-identical to one process's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import torch

from finetune_cli.data.encode import (
    EncodedData,
    collate,
    copy_into,
    encode_table,
    length_note,
    shape_key,
    to_device,
)
from finetune_cli.data.sampling import sorted_batches
from finetune_cli.data.sources import Table
from finetune_cli.engine.device import (
    GRAPH_MULTIPLE,
    autocast_dtype,
    capture_graph,
    device_can_capture,
    resolve_device,
    resolve_precision,
)
from finetune_cli.errors import DataError, DeviceError, TrainingError
from finetune_cli.models.exporters import exported_as
from finetune_cli.models.loading import (
    check_max_length,
    default_max_length,
    default_truncation,
    label_names,
    load_embedding_model,
    load_text_model,
    position_limit,
)
from finetune_cli.models.lora import lora_config, merge_lora
from finetune_cli.models.text_model import HeadSpec

_SHARD: ContextVar[Optional[Any]] = ContextVar("finetune_inference_shard", default=None)


@contextlib.contextmanager
def sharded(procs) -> Iterator[None]:
    """Within this block :func:`forward_all` splits its batches over ``procs`` (a
    ``distributed.Processes``); every rank must make the same ``forward_all`` calls."""
    token = _SHARD.set(procs if procs is not None and procs.distributed else None)
    try:
        yield
    finally:
        _SHARD.reset(token)


def forward_all(model, data: EncodedData, batch_size: int, pad_id: int, device: Optional[torch.device] = None,
                view: int = 0, want: tuple[str, ...] = ("logits",), progress=None,
                autocast_dtype: Optional[torch.dtype] = None,
                graphs: Optional[GraphedForward] = None) -> dict[str, np.ndarray]:
    """Run ``model`` over every example of ``data`` (one view), longest first, and return the
    requested outputs (``logits``, ``embeddings``) as float32 arrays in the original order.

    Outputs stay on the device until the end (one transfer, no host sync per batch), under
    ``torch.inference_mode``; ``autocast_dtype`` (e.g. bf16 on a GPU) runs the encoder in it.
    ``graphs``: run each batch through :class:`GraphedForward` (every batch padded to
    ``batch_size`` rows and a bucket width, one captured forward per width).
    """
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    batches = sorted_batches(data.lengths, batch_size)
    outs: dict[str, list[torch.Tensor]] = {k: [] for k in want}
    # (autocast's weight cache stays off under a graph: a capture must not keep casts made outside it)
    cast = (torch.autocast(device.type, dtype=autocast_dtype, cache_enabled=graphs is None)
            if autocast_dtype is not None else contextlib.nullcontext())
    done = 0
    procs = _SHARD.get()
    if procs is not None:  # sharded evaluation: this process scores every world-th batch
        batches = batches[procs.rank::procs.world]
    try:
        with torch.inference_mode(), cast:
            for idx in batches:
                if graphs is None:
                    batch = to_device(collate(data, idx, pad_id), device)
                    out = model(batch["features"][view])
                    res = {k: getattr(out, k) for k in want}
                else:
                    res = graphs(collate(data, graphs.rows_of(idx), pad_id, GRAPH_MULTIPLE, graphs.max_width),
                                 view, len(idx))
                for k in want:
                    v = res.get(k)
                    if v is not None:
                        outs[k].append(v.float())
                done += len(idx)
                if progress is not None:
                    progress.update(done)
    finally:
        if was_training:
            model.train()
    order = np.concatenate([np.asarray(b, dtype=np.int64) for b in batches]) if batches else np.zeros(0, np.int64)
    result: dict[str, np.ndarray] = {}
    for k, vs in outs.items():
        if vs:
            result[k] = torch.cat(vs).cpu().numpy()  # rows in `order`
    if procs is not None:  # gather every process's rows, then place them
        parts = procs.all_gather((order, result))
        order = np.concatenate([idx for idx, _ in parts])
        result = {k: np.concatenate([vals[k] for _, vals in parts if k in vals])
                  for k in {k for _, vals in parts for k in vals}}
    placed: dict[str, np.ndarray] = {}
    for k, host in result.items():
        arr = np.empty((len(data), *host.shape[1:]), dtype=host.dtype)
        arr[order] = host
        placed[k] = arr
    return placed


class GraphedForward:
    """Inference forwards replayed from CUDA graphs: each batch is padded to ``rows`` rows (the last
    row repeated) and to a bucket width (a multiple of :data:`~finetune_cli.engine.device.GRAPH_MULTIPLE`,
    at most ``max_width``), so a whole evaluation meets a handful of shapes; the model's forward of
    each shape is captured once (after a warm-up off the graph), the graphs share one memory pool,
    and every batch is copied into the captured inputs and replayed: one launch instead of hundreds.
    Padding changes no output (the attention mask hides padded tokens; the padded rows are dropped).
    ``capture=False`` (the CPU) runs the same padded batches eagerly, which the tests compare.
    """

    def __init__(self, model, device: torch.device, rows: int, max_width: int, capture: bool = True):
        self.model, self.device, self.rows, self.max_width, self.capture = model, device, rows, max_width, capture
        self.graphs: dict[tuple, tuple[Any, Any, dict[str, Any]]] = {}  # shape key -> (graph, inputs, outputs)
        self.pool: Any = None
        self.capture_s = 0.0

    def rows_of(self, idx: list[int]) -> list[int]:
        return list(idx) + [idx[-1]] * (self.rows - len(idx))

    def _outputs(self, features: dict[str, torch.Tensor]) -> dict[str, Optional[torch.Tensor]]:
        res = self.model(features)
        return {"logits": res.logits, "embeddings": res.embeddings}

    def __call__(self, batch: dict[str, Any], view: int, n: int) -> dict[str, Optional[torch.Tensor]]:
        """The outputs of the first ``n`` rows of a padded host batch (copies: the next replay
        overwrites the graph's own)."""
        features = batch["features"][view]
        if not self.capture:
            out = self._outputs(to_device(features, self.device))
        else:
            key = shape_key(features)
            if key not in self.graphs:
                self.graphs[key] = self._capture(features)
            graph, static, out = self.graphs[key]
            copy_into(static, features)
            graph.replay()
        return {k: None if v is None else v[:n].clone() for k, v in out.items()}

    def _capture(self, features: dict[str, torch.Tensor]) -> tuple[Any, Any, dict[str, Any]]:
        import time

        t0 = time.perf_counter()
        static = to_device({k: v.clone() for k, v in features.items()}, self.device)
        graph, out = capture_graph(lambda: self._outputs(static), self.device, self.pool, warmups=2)
        self.pool = graph.pool()
        self.capture_s += time.perf_counter() - t0
        return graph, static, out


def inference_graph_refusal(device: torch.device, exported: bool) -> Optional[str]:
    """Why this session's forwards cannot be captured as CUDA graphs, or None."""
    if exported:
        return "an exported folder runs in its own runtime"
    if not device_can_capture(device):
        return f"the model runs on {device.type}, not on a CUDA GPU"
    return None


def pad_id(tokenizer) -> int:
    """The id batches are padded with: the tokenizer's, else 0 (the attention mask hides it)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


def parse_threshold(choice: Optional[str]) -> Union[None, str, float]:
    """``--threshold``: None, ``tuned``, or a number in (0, 1); anything else is refused (checked
    before any model loads)."""
    if choice is None:
        return None
    if choice.strip().lower() == "tuned":
        return "tuned"
    try:
        value = float(choice)
    except ValueError:
        value = float("nan")
    if not 0.0 < value < 1.0:  # (NaN fails too)
        raise DataError(f"--threshold {choice}: give a number between 0 and 1 (exclusive), or `tuned`")
    return value


@dataclass
class InferenceSession:
    """A model loaded for inference: on its device, in eval mode, with the precision it runs in
    (fp32, bf16 or fp16, from :func:`~finetune_cli.engine.device.resolve_precision`) and the
    length its inputs are cut at. ``st``: the sentence-transformers config of an embedding folder."""

    model: Any
    tokenizer: Any
    path: str
    device: torch.device
    precision: str
    max_length: int
    st: Optional[Any] = None
    truncation: str = "head"  # model.truncation: how a row longer than max_length is cut
    length_key: str = "max_length"  # how the length is named in messages
    use_graphs: bool = False  # forwards replayed from CUDA graphs (``--cuda-graphs``), one set per batch size
    _graphs: dict = field(default_factory=dict)
    # rows this session encoded, and of them the ones longer than max_length (see ``length_note``)
    _rows: int = 0
    _cut: int = 0
    _windows: int = 0

    @property
    def pad_id(self) -> int:
        return pad_id(self.tokenizer)

    @property
    def label_names(self) -> list[str]:
        """A classifier's label names in id order, from its config's ``id2label`` (what its logits mean)."""
        return label_names(self.model.config, self.model.spec.num_labels)

    def decision_threshold(self, choice: Optional[str] = None) -> Union[float, np.ndarray]:
        """A multi-label classifier's decision threshold(s), from ``--threshold``: a number in (0, 1)
        for every label; ``tuned`` the per-label thresholds its folder saved (refused where it has
        none); None those when saved, else its single ``threshold``. Refused for other models."""
        spec = self.model.spec
        if choice is not None and spec.problem_type != "multi_label_classification":
            raise DataError(f"--threshold {choice}: {self.path} is a {spec.problem_type} model; the threshold "
                            f"decides the labels of a multi_label_classification model only")
        value = parse_threshold(choice)
        if value is None:
            return np.asarray(spec.thresholds) if spec.thresholds is not None else spec.threshold
        if value == "tuned":
            if spec.thresholds is None:
                raise DataError(f"--threshold tuned: {self.path} has no tuned thresholds (a multi-label run saves "
                                f"them when it has evaluation data); pass --threshold NUMBER")
            return np.asarray(spec.thresholds)
        return value

    def encode(self, table: Table, columns: Sequence[str], *, joint: bool, use_cache: bool = True,
               stride: Optional[int] = None) -> EncodedData:
        """Tokenise ``columns`` of ``table`` at the session's length and truncation rule (a pair
        jointly or as two views); ``stride``: long single texts in overlapping windows instead.
        The rows longer than the length are counted for :meth:`length_note`."""
        enc = encode_table(table, self.tokenizer, self.max_length, tuple(columns), joint=joint, use_cache=use_cache,
                           truncation=self.truncation, stride=stride)
        self._rows += enc.rows
        self._cut += enc.cut
        self._windows += len(enc)
        return enc

    def length_note(self, stride: Optional[int] = None) -> Optional[str]:
        """The warning line for every row this session encoded that was longer than its length."""
        if not self._cut:
            return None
        fake = EncodedData([], None, np.zeros(self._windows, np.int64), cut=self._cut,
                           window_rows=np.arange(self._rows) if stride is not None else None)
        return length_note(fake, f"{self.length_key}={self.max_length}", f"truncation={self.truncation}", stride)

    def encode_texts(self, texts: list[str]) -> EncodedData:
        """Tokenise plain sentences (one view, not cached: a one-off input)."""
        return self.encode(Table({"text": texts}, "<texts>"), ("text",), joint=False, use_cache=False)

    def forward(self, data: EncodedData, batch_size: int, *, want: tuple[str, ...] = ("logits",), view: int = 0,
                progress=None) -> dict[str, np.ndarray]:
        """:func:`forward_all` on the session's device, pad id and precision; running out of device
        memory is one line naming ``--batch-size``."""
        try:
            graphs = None
            if self.use_graphs:
                graphs = self._graphs.setdefault(batch_size, GraphedForward(self.model, self.device, batch_size,
                                                                            self.max_length))
            outs = forward_all(self.model, data, batch_size, self.pad_id, self.device, view=view, want=want,
                               progress=progress, autocast_dtype=autocast_dtype(self.precision), graphs=graphs)
            return outs if data.window_rows is None else {k: mean_by_row(v, data.window_rows, data.rows)
                                                          for k, v in outs.items()}
        except torch.cuda.OutOfMemoryError:  # = torch.OutOfMemoryError; this name on every torch >= 2.2
            raise TrainingError(f"out of memory on {self.device} at --batch-size {batch_size} "
                                f"(inputs cut at {self.max_length} tokens): lower --batch-size") from None

    def file_features(self, path: Path, pair: bool, batch_size: int) -> tuple[np.ndarray, list[str]]:
        """Pooled features and string labels of a ``text``/[``text_pair``]/``label`` JSONL file (a
        materialised probe task), the pair encoded jointly."""
        from finetune_cli.data.sources import read_file

        cm = {"text": "text", "label": "label", **({"text_pair": "text_pair"} if pair else {})}
        t = read_file(str(path), cm, "jsonl")
        labels = [str(v) for v in t.columns.pop("label")]
        enc = self.encode(t, ("text", "text_pair") if pair else ("text",), joint=True)
        return self.forward(enc, batch_size, want=("embeddings",))["embeddings"], labels

    def stream(self, chunks: Iterable[Table], columns: Sequence[str], batch_size: int, *, joint: bool,
               want: tuple[str, ...] = ("logits",), progress=None,
               stride: Optional[int] = None) -> Iterator[tuple[Table, dict[str, np.ndarray]]]:
        """Each chunk of rows with its outputs, in turn: tokenised, run in length-sorted batches and
        handed back before the next is read, so memory holds one chunk (``predict``, ``embed``)."""
        done = 0
        for chunk in chunks:
            texts = Table({f"text{i}": chunk.columns[c] for i, c in enumerate(columns)}, chunk.source)
            enc = self.encode(texts, tuple(texts.columns), joint=joint, use_cache=False, stride=stride)
            step = None if progress is None else _Offset(progress, done)
            yield chunk, self.forward(enc, batch_size, want=want, progress=step)
            done += len(chunk)


def mean_by_row(values: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
    """The mean of the windows' outputs of each row (``rows``: each window's row, every row present)."""
    total = np.zeros((n, *values.shape[1:]), dtype=np.float64)
    np.add.at(total, rows, values.astype(np.float64))
    counts = np.bincount(rows, minlength=n).reshape(n, *([1] * (values.ndim - 1)))
    return (total / counts).astype(values.dtype)


@dataclass
class _Offset:
    """A progress handle that counts on from the rows of the chunks before this one."""

    progress: Any
    base: int

    def update(self, completed: int, *args: Any, **kwargs: Any) -> None:
        self.progress.update(self.base + completed, *args, **kwargs)


def open_session(model_name: str, *, device: str = "auto", precision: str = "auto", max_length: Optional[int] = None,
                 length_key: str = "--max-length", embedding: bool = False,
                 truncation: Optional[str] = None, heads: Optional[HeadSpec] = None,
                 cuda_graphs: str = "off") -> InferenceSession:
    """Load ``model_name`` (run directory, model folder, LoRA adapter folder (its adapters folded in),
    ONNX folder (run in onnxruntime), ``embedded`` or hub id) for inference.

    ``device``/``precision`` are resolved first (a bad one fails before any loading). ``max_length``
    None is what the folder says (a sentence-transformers folder's ``max_seq_length``, else the
    trained length, else the tokenizer's, at most 512), cut to the model's position limit; a length
    given over that limit is refused naming ``length_key``. ``embedding``: read a sentence-transformers
    folder as ``SentenceTransformer`` does (its pooling, ``Normalize``, length), its config in ``st``.
    ``heads``: the heads to read the model with (the probe's encoder with the recipe's pooling and no
    classifier), instead of what the folder says.
    ``truncation`` None is the rule the folder was trained with (``finetune_model.json``), else ``head``.
    ``cuda_graphs`` (``--cuda-graphs``): ``on`` replays the forwards from CUDA graphs
    (:class:`GraphedForward`; refused in one line where they cannot run), ``auto`` where they can,
    ``off`` never.
    """
    dev = resolve_device(device)
    prec = resolve_precision(precision, dev)
    st = None
    exported = exported_as(model_name)
    use_graphs = False
    if cuda_graphs not in ("off", "auto", "on"):
        raise DeviceError(f"--cuda-graphs {cuda_graphs}: choose off, auto or on")
    if cuda_graphs != "off":
        why = inference_graph_refusal(dev, exported is not None)
        if why is not None and cuda_graphs == "on":
            raise DeviceError(f"--cuda-graphs on: {why}; use --cuda-graphs auto or off")
        use_graphs = why is None
    if exported is not None:  # an exported graph (ONNX), run in its own runtime (onnxruntime)
        if precision not in ("auto", "fp32"):
            raise DeviceError(f"--precision {precision}: an {exported.name.upper()} folder runs in the precision "
                              "it was exported in (fp32)")
        dev = torch.device("cpu") if device == "auto" else dev  # onnxruntime's CUDA provider: --device cuda
        model, tokenizer, path, st = exported.load(model_name, dev, embedding)
        prec = "fp32"
    elif embedding:
        model, tokenizer, path, st = load_embedding_model(model_name)
    else:
        model, tokenizer, path = load_text_model(model_name, heads)
    if max_length is None:  # nobody asked for this length: never refuse it, cut it to what the model takes
        max_length = st.max_seq_length if st is not None and st.max_seq_length else default_max_length(path, tokenizer)
        max_length = min(max_length, position_limit(getattr(model, "encoder", model)) or max_length)
    check_max_length(model, max_length, length_key, path)
    if lora_config(model) is not None:  # a LoRA adapter folder: folded in, it runs as fast as a full model
        merge_lora(model)
    model.to(dev).eval()
    return InferenceSession(model, tokenizer, path, dev, prec, max_length, st,
                            truncation=truncation or default_truncation(path), length_key=length_key,
                            use_graphs=use_graphs)
