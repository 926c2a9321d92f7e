"""Streaming ``predict`` and ``embed``: the output of a file read in many small chunks is the
output of the file read whole (same rows, order, columns and values), and a run stopped half-way
leaves nothing under the output's name."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from finetune_cli.data.sources import open_table
from finetune_cli.pipelines.embed import run_embed
from finetune_cli.pipelines.predict import run_predict
from finetune_cli.pipelines.recipes import load_plan
from finetune_cli.pipelines.train import run_train
from finetune_cli.ui import UI
from tests.conftest import QUICKSTART

WHOLE = 100_000  # one chunk: the file read whole


@pytest.fixture(scope="module")
def classifier(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("stream-run")
    ov = [f"model.name={tiny_model_dir}", "model.max_length=32", f"data.train={QUICKSTART / 'train.tsv'}",
          f"data.eval={QUICKSTART / 'dev.tsv'}", "data.columns.text=sentence", "data.max_train_samples=32",
          "train.batch_size=8", "train.max_steps=2", "train.lr=1e-3", f"output.dir={out}", "output.name=c"]
    return str(run_train(load_plan(None, ov), UI(quiet=True), device="cpu").run_dir)


@pytest.fixture
def rows_file(tmp_path):
    """37 rows of JSONL: texts of many lengths, an id, and a key only some records have."""
    sents = (QUICKSTART / "dev.tsv").read_text().splitlines()[1:38]
    f = tmp_path / "in.jsonl"
    with f.open("w") as h:
        for i, line in enumerate(sents):
            text = line.split("\t")[0] * (1 + i % 3)
            h.write(json.dumps({"id": i, "text": text, **({"note": f"n{i}"} if i % 5 == 0 else {})}) + "\n")
    return f


def _read(path) -> dict[str, list]:
    tf = open_table(str(path), header="yes")
    return tf.read({n: n for n in tf.names}, optional=tf.names).columns


@pytest.mark.parametrize("ext", ["jsonl", "json", "csv", "tsv", "parquet"])
def test_predict_in_chunks_equals_predict_whole(classifier, rows_file, tmp_path, ext):
    res = {}
    for size in (5, WHOLE):
        out = tmp_path / f"p{size}.{ext}"
        res[size] = run_predict(classifier, str(rows_file), str(out), UI(quiet=True), device="cpu", batch_size=4,
                                chunk_rows=size)
    small, whole = _read(tmp_path / f"p5.{ext}"), _read(tmp_path / f"p{WHOLE}.{ext}")
    assert list(small) == list(whole) == ["id", "text", "note", "pred_label", "prob_negative", "prob_positive"]
    for k in ("id", "text", "note", "pred_label"):
        assert small[k] == whole[k], k
    probs = [np.asarray(small[k], dtype=float) - np.asarray(whole[k], dtype=float) for k in small if k.startswith("prob")]
    assert np.abs(probs).max() < 1e-5  # other batches, other padding: equal up to float rounding
    a, b = res[5].to_dict(), res[WHOLE].to_dict()
    assert {k: v for k, v in a.items() if k not in ("output", "seconds")} == \
        {k: v for k, v in b.items() if k not in ("output", "seconds")}
    assert a["rows"] == 37 and sum(a["predicted"].values()) == 37


@pytest.mark.parametrize("suffix", [".npy", ".parquet"])
def test_embed_in_chunks_equals_embed_whole(classifier, rows_file, tmp_path, suffix):
    outs = {}
    for size in (4, WHOLE):
        out = tmp_path / f"e{size}{suffix}"
        res = run_embed(classifier, str(rows_file), str(out), UI(quiet=True), device="cpu", chunk_rows=size)
        assert res.sentences == 37 and res.dim == 32
        if suffix == ".npy":
            outs[size] = (np.load(out), np.load(res.ids_file).tolist(), None)
        else:
            import pyarrow.parquet as pq

            t = pq.read_table(out).to_pydict()
            outs[size] = (np.asarray(t["embedding"], dtype=np.float32), t["row_id"], t["text"])
    (e4, ids4, t4), (ew, idsw, tw) = outs[4], outs[WHOLE]
    assert e4.dtype == np.float32 and e4.shape == ew.shape == (37, 32)
    assert np.allclose(e4, ew, atol=1e-5) and ids4 == idsw == list(range(1, 38)) and t4 == tw


def test_npy_written_in_chunks_is_what_np_save_writes(classifier, rows_file, tmp_path):
    """Rows appended after a header that holds the count: byte for byte the file ``np.save`` writes."""
    res = run_embed(classifier, str(rows_file), str(tmp_path / "e.npy"), UI(quiet=True), device="cpu", chunk_rows=6)
    emb = np.load(tmp_path / "e.npy")
    np.save(tmp_path / "ref.npy", emb)
    np.save(tmp_path / "ref_ids.npy", np.arange(1, 38, dtype=np.int64))
    assert (tmp_path / "e.npy").read_bytes() == (tmp_path / "ref.npy").read_bytes()
    assert (tmp_path / "e.ids.npy").read_bytes() == (tmp_path / "ref_ids.npy").read_bytes()
    assert res.ids_file == str(tmp_path / "e.ids.npy")


@pytest.mark.parametrize("command", ["predict", "embed"])
def test_an_interrupted_run_leaves_no_output_and_a_rerun_starts_again(classifier, rows_file, tmp_path, monkeypatch,
                                                                      command):
    from finetune_cli.engine import inference

    real = inference.InferenceSession.forward
    calls = []

    def stop_on_the_third_chunk(self, *a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(inference.InferenceSession, "forward", stop_on_the_third_chunk)
    out = tmp_path / ("p.csv" if command == "predict" else "e.npy")
    run = run_predict if command == "predict" else run_embed
    with pytest.raises(KeyboardInterrupt):
        run(classifier, str(rows_file), str(out), UI(quiet=True), device="cpu", chunk_rows=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]  # no output, no temporary file
    monkeypatch.setattr(inference.InferenceSession, "forward", real)
    res = run(classifier, str(rows_file), str(out), UI(quiet=True), device="cpu", chunk_rows=5)
    assert out.is_file() and (res.rows if command == "predict" else res.sentences) == 37


def test_predict_carries_columns_through_as_training_reads_them(classifier, tmp_path):
    """A BOM, a U+2028 inside a JSON string, CRLF line ends: read as training reads them, written back clean."""
    f = tmp_path / "in.csv"
    f.write_bytes("\ufefftext,id\r\nfine day,1\r\n\"two\r\nlines\",2\r\n".encode())
    out = tmp_path / "o.csv"
    run_predict(classifier, str(f), str(out), UI(quiet=True), device="cpu")
    assert out.read_text(encoding="utf-8").startswith("text,id,pred_label,")
    assert _read(out)["text"] == ["fine day", "two\r\nlines"]
    j = tmp_path / "in.jsonl"
    j.write_text(json.dumps({"text": "a\u2028b"}, ensure_ascii=False) + "\n" + json.dumps({"text": "c"}) + "\n",
                 encoding="utf-8")
    res = run_predict(classifier, str(j), str(tmp_path / "o.jsonl"), UI(quiet=True), device="cpu")
    assert res.rows == 2 and _read(tmp_path / "o.jsonl")["text"] == ["a\u2028b", "c"]


# ---- memory on one huge line ---------------------------------------------------------------------

_PEAK = """
import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, r.stderr.strip().splitlines()[-1:])
"""


def _peak_rss_mb(args: list[str]) -> tuple[int, float, str]:
    """Exit code, peak RSS (MB) and last stderr line of ``finetune ARGS`` in a fresh process (the
    measuring process's only child, so the peak is that command's)."""
    import ast
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-c", _PEAK, sys.executable, "-c", "from finetune_cli.cli.main import app; app()", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120).stdout.split(" ", 2)
    return int(out[0]), int(out[1]) / 1024, (ast.literal_eval(out[2]) or [""])[0]


def test_embed_and_predict_memory_stays_bounded_on_a_100_mb_line(tiny_model_dir, tmp_path):
    """A file whose third line is 100 MB: ``embed`` and ``predict`` refuse it in one line naming the
    line and the limit, with a peak RSS within 100 MB of the same command on a small file (before
    the bound, reading it took ~140 MB per MB of the line: 14 GB here). One process each, measured
    by ``getrusage(RUSAGE_CHILDREN)`` in a fresh parent."""
    from finetune_cli.data.sources import MAX_ROW_CHARS

    small, huge = tmp_path / "small.txt", tmp_path / "huge.txt"
    small.write_text("a cat sat\nthe dog ran\n")
    with huge.open("w") as f:
        f.write("a cat sat\nthe dog ran\n")
        for _ in range(100):
            f.write("word " * 200_000)  # 1 MB
        f.write("\nlast line\n")
    base_code, base, _ = _peak_rss_mb(["embed", str(tiny_model_dir), str(small), "-o", str(tmp_path / "s.npy"),
                                       "--device", "cpu", "-q"])
    assert base_code == 0 and (tmp_path / "s.npy").is_file()
    code, peak, line = _peak_rss_mb(["embed", str(tiny_model_dir), str(huge), "-o", str(tmp_path / "h.npy"),
                                     "--device", "cpu", "-q"])
    assert code == 2 and "line 3" in line and f"{MAX_ROW_CHARS:,}" in line, line
    assert peak < base + 100, (peak, base)
    assert not (tmp_path / "h.npy").exists()
    (tmp_path / "huge.tsv").symlink_to(huge)  # one column named by its header line
    code, peak, line = _peak_rss_mb(["predict", str(tiny_model_dir), "-i", str(tmp_path / "huge.tsv"), "-c",
                                     "a cat sat", "-o", str(tmp_path / "p.csv"), "--device", "cpu", "-q"])
    assert code == 2 and "line 3" in line, line
    assert peak < base + 100, (peak, base)


def test_row_ids_are_the_record_number_in_every_format(tiny_model_dir, tmp_path):
    """The same five records as CSV (a header, a blank line; a text over two lines), TSV, JSONL
    (blank lines), JSON, TXT (blank lines) and Parquet: every format gives ids 1..5 (the n-th data
    record; a header and blank lines are not records) and the same vectors, in ``.ids.npy`` and in
    a Parquet output's ``row_id``."""
    import csv

    import pyarrow as pa
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from finetune_cli.cli.main import app

    texts = ["a quiet kettle", "the blender broke", "fine, I guess", "boils fast", "avoid it"]
    files = {}
    with (tmp_path / "in.csv").open("w", newline="") as h:
        w = csv.writer(h)
        w.writerow(["text", "n"])
        w.writerows([(t, i) for i, t in enumerate(texts[:2])])
        h.write("\n")
        w.writerows([(t, i) for i, t in enumerate(texts[2:], 2)])
    files["csv"] = tmp_path / "in.csv"
    files["csv2"] = tmp_path / "in2.csv"  # a record over two lines: the next record is still number 2
    files["csv2"].write_text('text\n"a quiet\nkettle"\nthe blender broke\n"fine, I guess"\nboils fast\navoid it\n')
    files["tsv"] = tmp_path / "in.tsv"
    files["tsv"].write_text("text\tn\n" + "".join(f"{t}\t{i}\n" for i, t in enumerate(texts)))
    files["jsonl"] = tmp_path / "in.jsonl"
    files["jsonl"].write_text("\n" + "\n\n".join(json.dumps({"text": t}) for t in texts) + "\n")
    files["json"] = tmp_path / "in.json"
    files["json"].write_text(json.dumps([{"text": t} for t in texts]))
    files["txt"] = tmp_path / "in.txt"
    files["txt"].write_text("\n".join(texts[:3]) + "\n\n\n" + "\n".join(texts[3:]) + "\n")
    files["parquet"] = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": texts}), files["parquet"])
    runner = CliRunner()
    vecs = {}
    for fmt, f in files.items():
        for suffix in (".npy", ".parquet"):
            out = tmp_path / f"{fmt}{suffix}"
            res = runner.invoke(app, ["embed", str(tiny_model_dir), "-i", str(f), "-o", str(out), "--device", "cpu", "-q"])
            assert res.exit_code == 0, (fmt, res.output)
            if suffix == ".npy":
                assert np.load(out.with_suffix(".ids.npy")).tolist() == [1, 2, 3, 4, 5], fmt
                vecs[fmt] = np.load(out)
            else:
                t = pq.read_table(out).to_pydict()
                assert t["row_id"] == [1, 2, 3, 4, 5] and t["text"][1:] == texts[1:], fmt
    for fmt, v in vecs.items():
        np.testing.assert_allclose(v, vecs["tsv"], atol=1e-5, err_msg=fmt)
