"""``finetune augment``: write a noisy copy of a data file by back-translation or simple edits.

Every column other than the rewritten text column(s) is carried through unchanged; each input row
becomes ``num_return`` output rows (in input order), optionally followed by the original rows.

Crash safety and resume: work happens in chunks of ``chunk_size`` input rows. Each finished chunk
is written atomically to ``<output>.parts/chunk-NNNNNN.jsonl`` next to a ``manifest.json`` that
records every setting that changes the output plus a digest of the input. A rerun with the same
settings skips the chunks already on disk (each chunk's RNG is seeded from ``(seed, chunk)``, so a
resumed run writes exactly what an uninterrupted one would); the final file is assembled into a
temporary file and renamed over ``output`` in one step, then the parts folder is removed. Bad
input (options, columns, models) is rejected before the parts folder is created.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from finetune_cli.augment import DEFAULT_BACKWARD, DEFAULT_FORWARD, AugmentOptionError
from finetune_cli.augment.backtranslate import SamplingSpec
from finetune_cli.augment.edits import EditSpec, edit_text, row_rng
from finetune_cli.data.sources import detect_format, read_file, resolve_path
from finetune_cli.errors import DataError, RunDirError
from finetune_cli.fsutil import atomic_write_json, atomic_write_text, clean_stale_temps

MANIFEST = "manifest.json"
# Column names tried, in order, when --column is not given (pairs first).
KNOWN_PAIRS = (("sentence1", "sentence2"), ("text", "text_pair"), ("premise", "hypothesis"),
               ("question1", "question2"), ("sentence_A", "sentence_B"), ("question", "sentence"))
KNOWN_SINGLE = ("text", "sentence")
OUTPUT_FORMATS = ("tsv", "csv", "jsonl", "json", "parquet", "txt")


@dataclass(frozen=True)
class AugmentConfig:
    """Everything ``finetune augment`` needs; ``settings()`` is what must match for a resume."""

    input: str
    output: str
    columns: tuple[str, ...] = ()
    format: str = "auto"
    header: str = "auto"
    backtranslate: bool = False
    forward_model: str = DEFAULT_FORWARD
    backward_model: str = DEFAULT_BACKWARD
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    edits: EditSpec = field(default_factory=EditSpec)
    num_return: int = 1
    seed: int = 42
    keep_originals: bool = False
    batch_size: int = 32
    chunk_size: int = 1024
    device: str = "auto"

    @property
    def method(self) -> str:
        return "backtranslate" if self.backtranslate else "edit"

    def settings(self, columns: tuple[str, ...]) -> dict[str, Any]:
        s: dict[str, Any] = {"method": self.method, "columns": list(columns), "num_return": self.num_return,
                             "seed": self.seed, "chunk_size": self.chunk_size}
        if self.backtranslate:
            s.update(forward_model=self.forward_model, backward_model=self.backward_model,
                     batch_size=self.batch_size, **dataclasses.asdict(self.sampling))
        else:
            s.update(dataclasses.asdict(self.edits))
        return s


@dataclass
class AugmentResult:
    input: str
    output: str
    method: str
    columns: list[str]
    rows_in: int
    rows_written: int
    variants_per_row: int
    originals_appended: bool
    fraction_changed: float
    chrf_mean: float
    chunks: int
    chunks_resumed: int
    seconds: float
    device: Optional[str]
    settings: dict[str, Any]
    examples: list[dict[str, str]]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---- options ------------------------------------------------------------------------------------

def validate(cfg: AugmentConfig) -> None:
    """Reject bad options with one line, before anything is read or written."""
    e, s = cfg.edits, cfg.sampling
    if cfg.backtranslate and e.active():
        raise AugmentOptionError("choose one method: --backtranslate or the edits (--delete-words, --swap-words, "
                                 "--delete-one-word), not both")
    if not cfg.backtranslate and not e.active():
        raise AugmentOptionError("no augmentation chosen: pass --backtranslate, --delete-words P, --swap-words P "
                                 "or --delete-one-word")
    checks = [
        (s.temperature >= 0, f"--temperature must be >= 0 (0 = beam search); got {s.temperature}"),
        (s.top_k >= 0, f"--top-k must be >= 0 (0 = off); got {s.top_k}"),
        (0 < s.top_p <= 1, f"--top-p must be in (0, 1]; got {s.top_p}"),
        (s.num_beams >= 1, f"--num-beams must be >= 1; got {s.num_beams}"),
        (s.max_length >= 1, f"--max-length must be >= 1; got {s.max_length}"),
        (0 <= e.delete_prob <= 1, f"--delete-words must be a probability in [0, 1]; got {e.delete_prob}"),
        (0 <= e.swap_prob <= 1, f"--swap-words must be a probability in [0, 1]; got {e.swap_prob}"),
        (cfg.num_return >= 1, f"--num-return must be >= 1; got {cfg.num_return}"),
        (cfg.batch_size >= 1, f"--batch-size must be >= 1; got {cfg.batch_size}"),
        (cfg.chunk_size >= 1, f"--chunk-size must be >= 1; got {cfg.chunk_size}"),
        (cfg.header in ("auto", "yes", "no"), f"--header must be auto, yes or no; got {cfg.header}"),
    ]
    for ok, msg in checks:
        if not ok:
            raise AugmentOptionError(msg)


# ---- input ---------------------------------------------------------------------------------------

@dataclass
class InputData:
    names: list[str]  # every column, in file order
    columns: dict[str, list[Any]]
    text_columns: tuple[str, ...]
    has_header: bool
    format: str

    def __len__(self) -> int:
        return len(self.columns[self.names[0]])


def _first_row(path: Path, fmt: str) -> Optional[list[str]]:
    with path.open(encoding="utf-8", newline="") as f:
        for line in f:
            if not line.strip("\r\n"):
                continue
            if fmt == "csv":
                return next(csv.reader([line]))
            return line.rstrip("\r\n").split("\t")
    return None


def _record_keys(path: Path, fmt: str, src: str) -> list[str]:
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return list(pq.read_schema(path).names)
    try:
        if fmt == "jsonl":
            with path.open(encoding="utf-8") as f:
                first = next((ln for ln in f if ln.strip()), None)
            rec = json.loads(first) if first is not None else None
        else:
            obj = json.loads(path.read_text(encoding="utf-8"))
            recs = obj.get("data", obj) if isinstance(obj, dict) else obj
            rec = recs[0] if recs else None
    except json.JSONDecodeError as e:
        raise DataError(f"malformed JSON in {src}: {e.msg} at line {e.lineno}") from None
    if rec is None:
        raise DataError(f"data file {src} is empty")
    if not isinstance(rec, dict):
        raise DataError(f"record 1 of {src} is not an object")
    return [str(k) for k in rec]


def _pick_columns(names: list[str], src: str) -> tuple[str, ...]:
    for pair in KNOWN_PAIRS:
        if all(c in names for c in pair):
            return pair
    for c in KNOWN_SINGLE:
        if c in names:
            return (c,)
    raise DataError(f"no --column given and none of the usual text columns in {src} (columns: "
                    f"{', '.join(names[:12])}); pass --column NAME (twice for pairs)")


def read_input(cfg: AugmentConfig) -> InputData:
    """Read every column of the input with the project's readers; check the text columns."""
    src = cfg.input
    path = resolve_path(src)
    if not path.is_file():
        raise DataError(f"data file not found: {src}")
    fmt = detect_format(path, cfg.format)
    wanted = tuple(cfg.columns)
    if fmt in ("tsv", "csv"):
        first = _first_row(path, fmt)
        if first is None:
            raise DataError(f"data file {src} is empty")
        if cfg.header == "yes":
            has_header = True
        elif cfg.header == "no":
            has_header = False
        else:  # auto: a header when it holds the named columns (or a usual text column when none is named)
            named = [c for c in wanted if not c.isdigit()]
            has_header = all(c in first for c in named) if named else (
                not wanted and any(c in first for c in KNOWN_SINGLE + tuple(x for p in KNOWN_PAIRS for x in p)))
        if has_header:
            if len(set(first)) != len(first):
                dup = next(c for c in first if first.count(c) > 1)
                raise DataError(f"column `{dup}` appears twice in the header of {src}")
            names = first
            colmap: dict[str, Any] = {n: n for n in names}
        else:
            names = [str(i) for i in range(len(first))]
            colmap = {n: int(n) for n in names}
        if not wanted:
            if not has_header:
                raise DataError(f"no --column given and none of the usual text columns in {src} (first row: "
                                f"{', '.join(first[:12])}); pass --column NAME, or a 0-based index for a file "
                                f"without header")
            wanted = _pick_columns(names, src)
        for c in wanted:
            if c not in names:
                raise DataError(f"missing column `{c}` in {src} (header: {', '.join(first[:12]) if has_header else 'none'})")
        table = read_file(src, colmap, fmt, "yes" if has_header else "no")
    elif fmt == "txt":
        has_header = False
        names = ["text"]
        if wanted and wanted != ("text",):
            raise DataError(f"{src} is plain text (one sentence a line): its only column is `text`")
        wanted = ("text",)
        table = read_file(src, {"text": "text"}, fmt)
    else:
        has_header = True
        names = _record_keys(path, fmt, src)
        if not wanted:
            wanted = _pick_columns(names, src)
        for c in wanted:
            if c not in names:
                raise DataError(f"missing column `{c}` in record 1 of {src} (keys: {', '.join(names[:12])})")
        table = read_file(src, {n: n for n in names}, fmt)
    if len(set(wanted)) != len(wanted):
        raise DataError(f"--column names the same column twice: {', '.join(wanted)}")
    if len(table) == 0:
        raise DataError(f"data file {src} has no rows")
    for c in wanted:
        bad = next((i for i, v in enumerate(table.columns[c]) if not isinstance(v, str)), None)
        if bad is not None:
            raise DataError(f"column `{c}` of {src} must hold text; row {table.row_ids[bad]} holds "
                            f"{type(table.columns[c][bad]).__name__}")
    return InputData(names, table.columns, wanted, has_header, fmt)


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ---- chunks ----------------------------------------------------------------------------------------

def parts_dir(output: Path) -> Path:
    return output.parent / f"{output.name}.parts"


def chunk_path(parts: Path, k: int) -> Path:
    return parts / f"chunk-{k:06d}.jsonl"


def chunk_seed(seed: int, k: int) -> int:
    """Each chunk's own seed, so a resumed run samples what an uninterrupted one would."""
    return int(hashlib.sha256(f"{seed}:{k}".encode()).hexdigest()[:15], 16)


def read_chunk(path: Path, start: int, stop: int, n_cols: int, n_ret: int) -> Optional[list[dict]]:
    """The chunk's records, or None when it is missing or not exactly rows ``start..stop-1``."""
    if not path.is_file():
        return None
    try:
        recs = [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    if [r.get("row") for r in recs] != list(range(start, stop)):
        return None
    for r in recs:
        if len(r.get("out", ())) != n_ret or any(len(v) != n_cols for v in r["out"]):
            return None
    return recs


def _chrf():
    try:
        from sacrebleu.metrics import CHRF
    except ImportError:
        raise DataError("the augment summary needs sacrebleu (pip install 'finetune-cli[augment]')") from None
    return CHRF()


def _compute_chunk(cfg: AugmentConfig, data: InputData, start: int, stop: int, k: int, translator, chrf,
                   progress) -> list[dict]:
    cols = data.text_columns
    n_ret = cfg.num_return
    texts = [str(data.columns[c][i]) for i in range(start, stop) for c in cols]  # row-major, all sides pooled
    if translator is not None:
        outs = translator(texts, num_return=n_ret, seed=chunk_seed(cfg.seed, k), progress=progress)
    else:
        outs = []
        for j, t in enumerate(texts):
            row, col = start + j // len(cols), j % len(cols)
            outs.append([edit_text(t, cfg.edits, row_rng(cfg.seed, row, v, col)) for v in range(n_ret)])
    recs = []
    for r, i in enumerate(range(start, stop)):
        variants, scores = [], []
        for v in range(n_ret):
            sides = [outs[r * len(cols) + c][v] for c in range(len(cols))]
            variants.append(sides)
            scores.append([chrf.sentence_score(hyp, [texts[r * len(cols) + c]]).score for c, hyp in enumerate(sides)])
        recs.append({"row": i, "out": variants, "chrf": scores})
    return recs


# ---- output -----------------------------------------------------------------------------------------

def _clean(v: Any) -> str:
    return " ".join(str(v).split()) if isinstance(v, str) else ("" if v is None else str(v))


def _output_rows(data: InputData, parts: Path, n_chunks: int) -> Iterator[dict[str, Any]]:
    for k in range(n_chunks):
        for rec in (json.loads(ln) for ln in chunk_path(parts, k).read_text(encoding="utf-8").splitlines() if ln):
            i = rec["row"]
            for sides in rec["out"]:
                row = {name: data.columns[name][i] for name in data.names}
                row.update(zip(data.text_columns, sides, strict=True))
                yield row


def write_output(rows: list[dict[str, Any]], data: InputData, output: Path, fmt: str) -> None:
    """Write all rows to a temporary sibling, then rename it over ``output`` (atomic)."""
    names = data.names
    if fmt in ("tsv", "txt"):
        buf = io.StringIO()
        if fmt == "txt":
            for r in rows:
                buf.write(_clean(r[data.text_columns[0]]) + "\n")
        else:
            if data.has_header:
                buf.write("\t".join(names) + "\n")
            for r in rows:
                buf.write("\t".join(_clean(r[n]) for n in names) + "\n")
        atomic_write_text(output, buf.getvalue())
    elif fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        if data.has_header:
            w.writerow(names)
        for r in rows:
            w.writerow([r[n] for n in names])
        atomic_write_text(output, buf.getvalue())
    elif fmt == "jsonl":
        atomic_write_text(output, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    elif fmt == "json":
        atomic_write_text(output, json.dumps(rows, ensure_ascii=False, indent=1) + "\n")
    elif fmt == "parquet":
        import os
        import tempfile

        import pyarrow as pa
        import pyarrow.parquet as pq

        fd, tmp = tempfile.mkstemp(dir=output.parent, prefix=f".{output.name}.", suffix=".tmp")
        os.close(fd)
        try:
            pq.write_table(pa.Table.from_pylist(rows), tmp)
            os.replace(tmp, output)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


# ---- the pipeline ------------------------------------------------------------------------------------

def run_augment(cfg: AugmentConfig, ui, overwrite: bool = False) -> AugmentResult:
    t0 = time.perf_counter()
    validate(cfg)
    data = read_input(cfg)
    out = Path(cfg.output).expanduser()
    out_fmt = detect_format(out, "auto") if out.suffix else data.format
    if out_fmt not in OUTPUT_FORMATS:
        raise AugmentOptionError(f"cannot write {cfg.output}: unsupported output format `{out_fmt}`")
    if out_fmt == "txt" and len(data.text_columns) > 1:
        raise AugmentOptionError(f"cannot write pairs to the plain-text file {cfg.output}; use .tsv, .csv or .jsonl")
    in_path = resolve_path(cfg.input)
    if out.resolve() == in_path.resolve():
        raise AugmentOptionError(f"--output {cfg.output} is the input file; choose another path")
    if out.is_dir():
        raise AugmentOptionError(f"--output {cfg.output} is a directory; give a file path")
    parts = parts_dir(out)
    n = len(data)
    n_chunks = (n + cfg.chunk_size - 1) // cfg.chunk_size
    manifest = {"input": cfg.input, "input_sha256": file_digest(in_path), "rows": n, "chunks": n_chunks,
                "settings": cfg.settings(data.text_columns)}
    fresh, discard = True, False
    if parts.is_dir():
        old = _read_manifest(parts)
        if overwrite or old is None:
            discard = True  # removed only once the models have loaded: a failed start keeps what was there
        elif _comparable(old) != _comparable(manifest):
            raise RunDirError(f"{parts} holds a partial run {_difference(old, manifest)}; "
                              f"pass --overwrite to start again")
        else:
            fresh = False
    if fresh and out.exists() and not overwrite:
        raise RunDirError(f"output {cfg.output} already exists; pass --overwrite to replace it")

    translator, device = None, None
    if cfg.backtranslate:
        from finetune_cli.augment.backtranslate import BackTranslator
        from finetune_cli.pipelines.evaluate import pick_device

        dev = pick_device(cfg.device)
        device = str(dev)
        ui.log(f"loading {cfg.forward_model} and {cfg.backward_model} on {device}")
        translator = BackTranslator.load(cfg.forward_model, cfg.backward_model, cfg.sampling, dev, cfg.batch_size)
    chrf = _chrf()

    # Nothing was written before this point: every check above fails with parts/ and output untouched.
    if discard:
        shutil.rmtree(parts)
    parts.mkdir(parents=True, exist_ok=True)
    clean_stale_temps(parts)
    if fresh:
        atomic_write_json(parts / MANIFEST, manifest)
    resumed = 0
    with ui.progress(n, f"augment ({cfg.method})") as prog:
        done_rows = 0
        for k in range(n_chunks):
            start, stop = k * cfg.chunk_size, min(n, (k + 1) * cfg.chunk_size)
            cp = chunk_path(parts, k)
            if read_chunk(cp, start, stop, len(data.text_columns), cfg.num_return) is not None:
                resumed += 1
            else:
                # Within a chunk: texts generated so far (forward, then backward pass) as the bar's note.
                stage_total = (stop - start) * len(data.text_columns) * (1 + cfg.num_return)
                seen = [0]

                def tick(m: int, k=k, start=start, stage_total=stage_total, seen=seen) -> None:
                    seen[0] += m
                    prog.update(start, f"chunk {k + 1}/{n_chunks}: {seen[0]}/{stage_total} generations")

                recs = _compute_chunk(cfg, data, start, stop, k, translator, chrf, tick)
                atomic_write_text(cp, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs))
            done_rows = stop
            prog.update(done_rows, f"chunk {k + 1}/{n_chunks}", force_line=True)
    if resumed:
        ui.log(f"resumed: {resumed} of {n_chunks} chunks were already done in {parts}")

    rows = list(_output_rows(data, parts, n_chunks))
    changed = total = 0
    chrf_sum = 0.0
    for k in range(n_chunks):
        for ln in chunk_path(parts, k).read_text(encoding="utf-8").splitlines():
            rec = json.loads(ln)
            i = rec["row"]
            for sides, scores in zip(rec["out"], rec["chrf"], strict=True):
                for c, (hyp, sc) in enumerate(zip(sides, scores, strict=True)):
                    total += 1
                    changed += hyp != " ".join(str(data.columns[data.text_columns[c]][i]).split())
                    chrf_sum += sc
    examples = [{"input": str(data.columns[data.text_columns[0]][i // cfg.num_return]),
                 "output": str(rows[i][data.text_columns[0]])} for i in range(min(3, len(rows)))]
    if cfg.keep_originals:
        rows += [{name: data.columns[name][i] for name in data.names} for i in range(n)]
    write_output(rows, data, out, out_fmt)
    shutil.rmtree(parts, ignore_errors=True)
    return AugmentResult(
        input=cfg.input, output=str(out), method=cfg.method, columns=list(data.text_columns), rows_in=n,
        rows_written=len(rows), variants_per_row=cfg.num_return, originals_appended=cfg.keep_originals,
        fraction_changed=changed / total if total else 0.0, chrf_mean=chrf_sum / total if total else 0.0,
        chunks=n_chunks, chunks_resumed=resumed, seconds=time.perf_counter() - t0, device=device,
        settings=manifest["settings"], examples=examples)


def _read_manifest(parts: Path) -> Optional[dict]:
    try:
        return json.loads((parts / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def _comparable(m: dict) -> dict:
    return {k: v for k, v in m.items() if k != "input"}  # the same file named another way is the same input


def _difference(old: dict, new: dict) -> str:
    if old.get("input_sha256") != new.get("input_sha256") or old.get("rows") != new.get("rows"):
        return f"of a different input (the file {new['input']} changed)"
    a, b = old.get("settings", {}), new.get("settings", {})
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            return f"with other settings ({key}: {a.get(key)!r} there, {b.get(key)!r} now)"
    return "with other settings"
