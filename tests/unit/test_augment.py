"""`finetune augment`: word edits, batched back-translation with a tiny random Marian model built
offline, resume after an interruption, and one-line errors for bad input."""

from __future__ import annotations

import collections
import json
import random
import shutil

import pytest
from typer.testing import CliRunner

from finetune_cli.augment.edits import EditSpec, delete_one_word, delete_words, edit_text, row_rng, swap_words
from finetune_cli.cli.main import app
from tests.marian_tiny import build_tiny_marian, corpus_sentences

runner = CliRunner()
SENTS = corpus_sentences()


@pytest.fixture(scope="session")
def marian_dir(tmp_path_factory):
    return build_tiny_marian(tmp_path_factory.mktemp("tiny-marian") / "model")


@pytest.fixture(scope="session")
def marian(marian_dir):
    import torch

    from finetune_cli.augment.backtranslate import load_seq2seq

    return load_seq2seq(str(marian_dir), torch.device("cpu"))


def write_tsv(path, header, rows):
    path.write_text("\t".join(header) + "\n" + "".join("\t".join(map(str, r)) + "\n" for r in rows), encoding="utf-8")
    return path


def read_tsv(path):
    lines = path.read_text(encoding="utf-8").splitlines()
    return lines[0].split("\t"), [ln.split("\t") for ln in lines[1:]]


def sst_like(tmp_path, n=30, name="in.tsv"):
    rows = [(f"id{i}", SENTS[i], "positive" if i % 3 else "negative") for i in range(n)]
    return write_tsv(tmp_path / name, ["id", "sentence", "label"], rows), rows


def bt_args(marian_dir, *extra):
    return ["--backtranslate", "--forward-model", str(marian_dir), "--backward-model", str(marian_dir),
            "--max-length", "12", "-q", *extra]


def invoke(*args):
    return runner.invoke(app, ["augment", *map(str, args)])


def error_line(res) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines, res.output
    return lines[-1]


# ---- edits ------------------------------------------------------------------------------------------

def test_word_edits_do_what_they_say():
    words = "a b c d e f g h".split()
    rng = random.Random(0)
    for _ in range(50):
        out = delete_one_word(words, rng)
        assert len(out) == len(words) - 1 and all(w in words for w in out)
        sw = swap_words(words, 0.5, rng)
        assert sorted(sw) == sorted(words)  # a permutation: nothing lost, nothing added
        kept = delete_words(words, 0.5, rng)
        assert 1 <= len(kept) <= len(words) and kept == [w for w in words if w in kept]  # order kept
    assert delete_words(words, 0.0, rng) == words and swap_words(words, 0.0, rng) == words
    assert len(delete_words(words, 1.0, rng)) == 1  # never an empty sentence
    assert delete_one_word(["solo"], rng) == ["solo"]
    # a probability p deletes about p of the words
    n_kept = sum(len(delete_words(words, 0.25, rng)) for _ in range(2000))
    assert n_kept / (2000 * len(words)) == pytest.approx(0.75, abs=0.03)


def test_edits_are_seeded_per_row():
    spec = EditSpec(delete_prob=0.3, swap_prob=0.3)
    text = "the quick brown fox jumps over the lazy dog"
    assert edit_text(text, spec, row_rng(1, 5, 0, 0)) == edit_text(text, spec, row_rng(1, 5, 0, 0))
    outs = {edit_text(text, spec, row_rng(s, 5, 0, 0)) for s in range(20)}
    assert len(outs) > 5


def test_edit_output_does_not_depend_on_chunking(tmp_path):
    src, rows = sst_like(tmp_path, n=25)
    for cs in (4, 1000):
        res = invoke("-i", src, "-o", tmp_path / f"out{cs}.tsv", "--delete-words", "0.2", "--swap-words", "0.2",
                     "-n", "2", "--chunk-size", cs, "--seed", "3", "-q")
        assert res.exit_code == 0, res.output
    assert (tmp_path / "out4.tsv").read_text() == (tmp_path / "out1000.tsv").read_text()


# ---- back-translation -----------------------------------------------------------------------------------

def test_batching_preserves_order(marian):
    from finetune_cli.augment.backtranslate import SamplingSpec, generate

    texts = SENTS[:8] + ["", "Short."]
    spec = SamplingSpec(temperature=0, num_beams=2, max_length=12)
    one = generate(marian, texts, spec, batch_size=1)
    batched = generate(marian, texts, spec, batch_size=4)
    assert batched == one and len(batched) == len(texts)
    assert batched[8] == [""]  # empty in, empty out
    assert len({o[0] for o in one}) > 4  # outputs depend on the input, so a mix-up would show
    perm = list(range(len(texts)))
    random.Random(1).shuffle(perm)
    assert generate(marian, [texts[i] for i in perm], spec, batch_size=4) == [one[i] for i in perm]


def test_higher_temperature_gives_more_distinct_outputs(marian):
    from finetune_cli.augment.backtranslate import BackTranslator, SamplingSpec

    texts = SENTS[:8]

    def distinct(t: float) -> float:
        bt = BackTranslator(marian, marian, SamplingSpec(temperature=t, max_length=12), batch_size=48)
        outs = bt(texts, num_return=6, seed=0)
        return sum(len(set(o)) for o in outs) / len(outs)

    cold, hot = distinct(0.05), distinct(1.5)
    print("distinct outputs per input of 6:", cold, hot)
    assert hot > cold + 2 and hot > 4, (cold, hot)
    beam = BackTranslator(marian, marian, SamplingSpec(temperature=0, num_beams=2, max_length=10), batch_size=8)
    assert beam(texts, seed=0) == beam(texts, seed=1)  # beam search: no randomness at all


def test_pipeline_carries_other_columns_and_keeps_order(tmp_path, marian_dir):
    src, rows = sst_like(tmp_path, n=12)
    out = tmp_path / "noisy.tsv"
    res = invoke("-i", src, "-o", out, *bt_args(marian_dir, "-t", "1.2", "-n", "2", "--batch-size", "8",
                                                 "--chunk-size", "5", "--keep-originals", "--json"))
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    header, got = read_tsv(out)
    assert header == ["id", "sentence", "label"]
    assert len(got) == summary["rows_written"] == 12 * 2 + 12
    assert [r[0] for r in got[:24]] == [f"id{i}" for i in range(12) for _ in range(2)]
    assert [r[2] for r in got[:24]] == [rows[i][2] for i in range(12) for _ in range(2)]
    assert [tuple(r) for r in got[24:]] == rows  # originals appended unchanged
    assert summary["fraction_changed"] > 0.9 and 0 <= summary["chrf_mean"] < 50
    assert summary["chunks"] == 3 and not (tmp_path / "noisy.tsv.parts").exists()


def test_pairs_rewrite_both_sides_and_keep_json_types(tmp_path, marian_dir):
    src = tmp_path / "pairs.jsonl"
    recs = [{"idx": i, "sentence1": SENTS[i], "sentence2": SENTS[i + 40], "score": i / 4, "meta": {"k": i}}
            for i in range(5)]
    src.write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = tmp_path / "noisy.jsonl"
    res = invoke("-i", src, "-o", out, *bt_args(marian_dir, "-t", "1.0", "--json"))
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["columns"] == ["sentence1", "sentence2"]
    got = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert len(got) == 5
    for r, g in zip(recs, got, strict=True):
        assert {k: g[k] for k in ("idx", "score", "meta")} == {k: r[k] for k in ("idx", "score", "meta")}
        assert g["sentence1"] != r["sentence1"] and g["sentence2"] != r["sentence2"]


def test_same_seed_same_output(tmp_path, marian_dir):
    src, _ = sst_like(tmp_path, n=4)
    outs = []
    for name, seed in (("a", 5), ("b", 5), ("c", 6)):
        res = invoke("-i", src, "-o", tmp_path / f"{name}.tsv", *bt_args(marian_dir, "-t", "1.0", "--seed", seed))
        assert res.exit_code == 0, res.output
        outs.append((tmp_path / f"{name}.tsv").read_text())
    assert outs[0] == outs[1] and outs[0] != outs[2]


def test_interrupted_then_resumed_equals_uninterrupted(tmp_path, marian_dir, monkeypatch):
    import finetune_cli.pipelines.augment as pipe

    src, _ = sst_like(tmp_path, n=13)
    args = bt_args(marian_dir, "-t", "1.0", "-n", "2", "--chunk-size", "3", "--batch-size", "8")
    ref = tmp_path / "ref.tsv"
    assert invoke("-i", src, "-o", ref, *args).exit_code == 0

    out = tmp_path / "out.tsv"
    parts = tmp_path / "out.tsv.parts"
    real = pipe.compute_chunk
    calls = collections.Counter()

    def crash_on_third_chunk(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(pipe, "compute_chunk", crash_on_third_chunk)
    res = invoke("-i", src, "-o", out, *args)
    assert res.exit_code == 130 and "interrupted" in error_line(res)
    assert not out.exists()
    assert sorted(p.name for p in parts.iterdir()) == ["chunk-000000.jsonl", "chunk-000001.jsonl", "manifest.json"]
    # a crash in the middle of a write leaves a temp file; a damaged chunk is not trusted either
    (parts / ".chunk-000002.jsonl.x.tmp").write_text('{"row": 6}\n')
    (parts / "chunk-000003.jsonl").write_text('{"row": 9, "out": [["x"]]}\n')
    monkeypatch.setattr(pipe, "compute_chunk", real)

    res = invoke("-i", src, "-o", out, *args, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["chunks_resumed"] == 2
    assert out.read_text() == ref.read_text()
    assert not parts.exists()


def test_resume_with_other_settings_is_refused(tmp_path, monkeypatch):
    import finetune_cli.pipelines.augment as pipe

    src, _ = sst_like(tmp_path, n=12)
    out = tmp_path / "out.tsv"
    real = pipe.compute_chunk

    def crash(*a, **kw):
        if a[4] == 1:  # second chunk
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(pipe, "compute_chunk", crash)
    assert invoke("-i", src, "-o", out, "--delete-words", "0.2", "--chunk-size", "5", "-q").exit_code == 130
    monkeypatch.setattr(pipe, "compute_chunk", real)
    res = invoke("-i", src, "-o", out, "--delete-words", "0.3", "--chunk-size", "5", "-q")
    assert res.exit_code == 2
    assert "holds a different augment run (settings.delete_prob: 0.2 there, 0.3 now); pass --overwrite" in error_line(res)
    write_tsv(src, ["id", "sentence", "label"], [("x", "changed input", "1")] * 12)
    res = invoke("-i", src, "-o", out, "--delete-words", "0.2", "--chunk-size", "5", "-q")
    assert res.exit_code == 2 and "input_file.sha256:" in error_line(res)
    res = invoke("-i", src, "-o", out, "--delete-words", "0.3", "--chunk-size", "5", "-q", "--overwrite")
    assert res.exit_code == 0, res.output
    assert len(read_tsv(out)[1]) == 12


def test_headerless_file_by_index_and_txt(tmp_path):
    src = tmp_path / "cola.tsv"
    src.write_text("".join(f"src{i}\t{i % 2}\t\t{SENTS[i]}\n" for i in range(6)))
    out = tmp_path / "out.tsv"
    res = invoke("-i", src, "-o", out, "--column", "3", "--delete-one-word", "-q")
    assert res.exit_code == 0, res.output
    got = [ln.split("\t") for ln in out.read_text().splitlines()]
    assert len(got) == 6 and [r[:3] for r in got] == [[f"src{i}", str(i % 2), ""] for i in range(6)]
    assert all(len(g[3].split()) == len(SENTS[i].split()) - 1 for i, g in enumerate(got))
    txt = tmp_path / "s.txt"
    txt.write_text("\n".join(SENTS[:5]) + "\n")
    res = invoke("-i", txt, "-o", tmp_path / "s2.txt", "--swap-words", "0.5", "-q")
    assert res.exit_code == 0 and len((tmp_path / "s2.txt").read_text().splitlines()) == 5


@pytest.mark.parametrize("ext", ["tsv", "csv", "jsonl", "json", "parquet"])
def test_every_output_format_reads_back(tmp_path, ext):
    """Each format is written by the one table writer and read back by the table reader, rows in order."""
    from finetune_cli.data.sources import open_table

    src, rows = sst_like(tmp_path, n=7)
    out = tmp_path / f"out.{ext}"
    res = invoke("-i", src, "-o", out, "--delete-one-word", "-n", "2", "--chunk-size", "3", "--keep-originals", "-q")
    assert res.exit_code == 0, res.output
    tf = open_table(str(out), header="yes")
    got = tf.read({n: n for n in tf.names}).columns
    assert list(got) == ["id", "sentence", "label"]
    assert got["id"] == [r[0] for r in rows for _ in range(2)] + [r[0] for r in rows]
    assert got["sentence"][14:] == [r[1] for r in rows] and got["label"][14:] == [r[2] for r in rows]


# ---- bad input ----------------------------------------------------------------------------------------

def test_help_lists_augment():
    res = runner.invoke(app, ["--help"])
    assert res.exit_code == 0 and "augment" in res.stdout
    assert runner.invoke(app, ["augment", "--help"]).exit_code == 0


@pytest.mark.parametrize("case", ["missing column", "no usual column", "empty file", "header only",
                                  "negative temperature", "no method", "two methods", "top-p",
                                  "model folder without config", "unreadable model folder", "not seq2seq",
                                  "missing model path", "hub offline", "output exists", "output is input"])
def test_bad_input_one_line_and_nothing_written(tmp_path, marian_dir, tiny_model_dir, case):
    src, _ = sst_like(tmp_path, n=5)
    out = tmp_path / "out.tsv"
    bt = ["--backtranslate", "--forward-model", str(marian_dir), "--backward-model", str(marian_dir)]
    broken = tmp_path / "broken"
    args, message = {
        "missing column": (["--column", "txt", *bt], "missing column `txt` in"),
        "no usual column": (["--delete-one-word"], "no --column given and none of the usual text columns in"),
        "empty file": (["--delete-one-word"], "is empty"),
        "header only": (["--delete-one-word"], "has no rows"),
        "negative temperature": ([*bt, "--temperature", "-0.5"], "--temperature must be >= 0 (0 = beam search); got -0.5"),
        "no method": ([], "no augmentation chosen: pass --backtranslate"),
        "two methods": ([*bt, "--delete-words", "0.1"], "choose one method"),
        "top-p": ([*bt, "--top-p", "0"], "--top-p must be in (0, 1]"),
        "model folder without config": (["--backtranslate", "--forward-model", str(tmp_path)],
                                        "has no config.json: not a Hugging Face model folder"),
        "unreadable model folder": (["--backtranslate", "--forward-model", str(broken), "--backward-model",
                                     str(marian_dir)], f"cannot load translation model from {broken}"),
        "not seq2seq": (["--backtranslate", "--forward-model", str(tiny_model_dir)],
                        "is not a sequence-to-sequence (translation) model"),
        "missing model path": (["--backtranslate", "--forward-model", "./no/such/model"],
                               "model path does not exist: ./no/such/model"),
        "hub offline": (["--backtranslate"], "model `Helsinki-NLP/opus-mt-en-de` is not a local folder"),
        "output exists": (["--delete-one-word"], "already exists; pass --overwrite"),
        "output is input": (["--delete-one-word"], "is the input file"),
    }[case]
    if case == "no usual column":
        write_tsv(src, ["a", "b"], [("x y", "1")])
    elif case == "empty file":
        src.write_text("")
    elif case == "header only":
        src.write_text("id\tsentence\tlabel\n")
    elif case == "unreadable model folder":
        shutil.copytree(marian_dir, broken)
        (broken / "config.json").write_text("{not json")
    elif case == "output exists":
        out.write_text("precious\n")
    elif case == "output is input":
        out = src
    before = out.read_text() if out.exists() else None
    res = invoke("-i", src, "-o", out, *args, "-q")
    assert res.exit_code == 2, res.output
    line = error_line(res)
    assert message in line and line.startswith("error: ")
    assert len([ln for ln in res.stderr.splitlines() if ln.strip()]) == 1
    assert not (tmp_path / f"{out.name}.parts").exists()
    assert (out.read_text() if out.exists() else None) == before


def test_noisy_ce_recipe_trains_on_an_augmented_file(tmp_path, tiny_recipe, quickstart_data):
    """The documented flow: `finetune augment` writes noisy.tsv, `finetune train -r noisy_ce` trains on it."""
    noisy = tmp_path / "noisy.tsv"
    res = invoke("-i", quickstart_data["train"], "-o", noisy, "--delete-words", "0.3", "-q")
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["train", "-r", "noisy_ce", *tiny_recipe(), f"data.train={noisy}",
                              f"data.eval={quickstart_data['eval']}", "--json", "-q"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["train_examples"] == 64 and (tmp_path / "runs" / "tiny" / "final" / "config.json").is_file()
