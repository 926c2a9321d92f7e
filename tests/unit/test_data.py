"""Data: readers, GLUE folders, label mapping, few-shot, samplers, encoding and collation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from finetune_cli.data import collate, encode_table, load_task_data, read_file
from finetune_cli.data.sampling import Padding, epoch_batches, length_grouped_batches, random_batches
from finetune_cli.data.tasks import few_shot_indices
from finetune_cli.errors import DataError
from finetune_cli.pipelines.recipes import load_recipe


def _cfg(*ov):
    return load_recipe(None, list(ov)).data


def _load(*ov, need_eval=False, label_type="class", data_dir=None, required=("text", "label"), min_classes=1):
    return load_task_data(_cfg(*ov), seed=1, label_type=label_type, required_columns=required,
                          data_dir=data_dir, need_eval=need_eval, min_classes=min_classes)


def test_tsv_without_quote_processing(tmp_path):
    f = tmp_path / "a.tsv"
    f.write_text('sentence\tlabel\n"quoted start and a lone " quote\t1\nplain\t0\n')
    t = read_file(str(f), {"text": "sentence", "label": "label"})
    assert t.columns["text"] == ['"quoted start and a lone " quote', "plain"]
    assert t.columns["label"] == ["1", "0"]


def test_headerless_tsv_by_index(tmp_path):
    f = tmp_path / "cola.tsv"
    f.write_text("src\t1\t\tGood sentence .\nsrc\t0\t*\tBad sentence .\n")
    t = read_file(str(f), {"text": 3, "label": 1}, header="no")
    assert t.columns == {"text": ["Good sentence .", "Bad sentence ."], "label": ["1", "0"]}


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "json", "parquet"])
def test_other_formats(tmp_path, fmt):
    rows = [{"s": 'a, "b"', "y": "pos"}, {"s": "c", "y": "neg"}]
    f = tmp_path / f"d.{fmt}"
    if fmt == "csv":
        import csv

        with f.open("w", newline="") as h:
            w = csv.DictWriter(h, ["s", "y"])
            w.writeheader()
            w.writerows(rows)
    elif fmt == "jsonl":
        f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "json":
        f.write_text(json.dumps(rows))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), f)
    t = read_file(str(f), {"text": "s", "label": "y"})
    assert t.columns == {"text": ['a, "b"', "c"], "label": ["pos", "neg"]}


def test_txt_one_sentence_per_line(tmp_path):
    f = tmp_path / "s.txt"
    f.write_text("first line\n\nsecond line\n")
    assert read_file(str(f), {"text": "text"}).columns == {"text": ["first line", "second line"]}


def test_missing_file_column_short_row_and_empty(tmp_path):
    with pytest.raises(DataError, match="data file not found: nope.tsv"):
        read_file("nope.tsv", {"text": "text"})
    f = tmp_path / "a.tsv"
    f.write_text("sentence\tlabel\nx\t1\n")
    with pytest.raises(DataError, match=r"missing column `text` in .*a.tsv \(header: sentence, label\)"):
        read_file(str(f), {"text": "text", "label": "label"})
    f.write_text("a\tb\tc\nx\ty\n")
    with pytest.raises(DataError, match=r"row 2 of .* has 2 fields, expected at least 3"):
        read_file(str(f), {"text": "a", "label": "c"})
    f.write_text("")
    with pytest.raises(DataError, match="is empty"):
        read_file(str(f), {"text": "text"})
    f.write_text("sentence\tlabel\n")
    with pytest.raises(DataError, match="is empty"):
        _load(f"data.train={f}", "data.columns.text=sentence")


def test_label_mapping_unseen_and_unlabeled(tmp_path):
    tr, ev = tmp_path / "tr.tsv", tmp_path / "ev.tsv"
    tr.write_text("text\tlabel\na\t10\nb\t9\nc\t10\n")
    ev.write_text("text\tlabel\nd\t9\n")
    d = _load(f"data.train={tr}", f"data.eval={ev}")
    assert d.label_names == ["9", "10"]  # numeric order, not string order
    assert d.train.columns["label"] == [1, 0, 1] and d.eval.columns["label"] == [0]
    ev.write_text("text\tlabel\nd\t11\n")
    with pytest.raises(DataError, match=r"label `11` in row 2 of .*ev.tsv was never seen in training \(known: 9, 10\)"):
        _load(f"data.train={tr}", f"data.eval={ev}")
    tr.write_text("text\tlabel\na\t1\nb\t\n")
    with pytest.raises(DataError, match=r"row 3 of .*tr.tsv has no label"):
        _load(f"data.train={tr}")


def test_min_classes_and_float_labels(tmp_path):
    tr = tmp_path / "tr.tsv"
    tr.write_text("text\tlabel\na\t1\nb\t1\n")
    with pytest.raises(DataError, match="has 1 class"):
        _load(f"data.train={tr}", min_classes=2)
    tr.write_text("text\tlabel\na\t1.5\nb\tx\n")
    with pytest.raises(DataError, match=r"label `x` in row 3 .* is not a number"):
        _load(f"data.train={tr}", label_type="float")


def test_eval_columns_name_the_eval_files_columns_for_a_classifier(tmp_path):
    tr, ev = tmp_path / "tr.tsv", tmp_path / "ev.tsv"
    tr.write_text("sentence\tlabel\na\tpos\nb\tneg\n")
    ev.write_text("review\tgold\nc\tneg\n")
    d = _load(f"data.train={tr}", f"data.eval={ev}", "data.columns.text=sentence", "data.eval_columns.text=review",
              "data.eval_columns.label=gold")
    assert d.train.columns["text"] == ["a", "b"] and d.eval.columns == {"text": ["c"], "label": [0]}


def test_nested_lists_in_a_multi_label_row_are_refused(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_text('{"text": "a", "label": ["comedy"]}\n{"text": "b", "label": [["comedy"], 3]}\n')
    with pytest.raises(DataError, match=r"row 2 of .*m.jsonl has the label \[\['comedy'\], 3\]: a multi-label row is "
                                        r"a flat list"):
        _load(f"data.train={f}", label_type="multi")


def test_few_shot_is_per_class_and_seeded():
    labels = [0] * 50 + [1] * 30 + [2] * 3
    a = few_shot_indices(labels, 5, seed=3)
    assert a == few_shot_indices(labels, 5, seed=3) and a != few_shot_indices(labels, 5, seed=4)
    got = np.bincount(np.asarray(labels)[a])
    assert got.tolist() == [5, 5, 3]


def test_few_shot_through_recipe(quickstart_data):
    d = _load(f"data.train={quickstart_data['train']}", "data.columns.text=sentence", "data.few_shot=7")
    assert np.bincount(d.train.columns["label"]).tolist() == [7, 7]


def test_glue_data_dir_reads_local_folder(tmp_path):
    sst = tmp_path / "SST-2"
    sst.mkdir()
    (sst / "train.tsv").write_text("sentence\tlabel\ngood film\t1\nbad film\t0\n")
    (sst / "dev.tsv").write_text("sentence\tlabel\nfine\t1\n")
    d = _load("data.dataset=glue:sst2", data_dir=tmp_path)
    assert d.label_names == ["negative", "positive"]  # hub ClassLabel order and names
    assert d.train.columns == {"text": ["good film", "bad film"], "label": [1, 0]}
    assert d.eval.columns["label"] == [1]
    with pytest.raises(DataError, match="no validation file for GLUE task"):
        (sst / "dev.tsv").unlink()
        _load("data.dataset=glue:sst2", data_dir=tmp_path)


def test_hub_dataset_offline_error():
    with pytest.raises(DataError, match=r"cannot load hub dataset glue:sst2\[train\]"):
        _load("data.dataset=glue:sst2")


def _lengths(n=500, seed=0):
    return np.random.default_rng(seed).integers(3, 60, size=n)


@pytest.mark.parametrize("fn", [length_grouped_batches, random_batches])
def test_samplers_cover_every_example_once_and_are_seeded(fn):
    lens = _lengths()
    b = fn(lens, None, 16, seed=1, epoch=0)
    flat = sorted(i for batch in b for i in batch)
    assert flat == list(range(len(lens)))
    assert b == fn(lens, None, 16, seed=1, epoch=0)
    assert b != fn(lens, None, 16, seed=1, epoch=1) and b != fn(lens, None, 16, seed=2, epoch=0)


def test_length_grouping_reduces_padding():
    lens = _lengths(3000)

    def padded(batches):
        return sum(max(lens[i] for i in b) * len(b) for b in batches)

    grouped = padded(length_grouped_batches(lens, None, 32, 0, 0))
    rand = padded(random_batches(lens, None, 32, 0, 0))
    assert grouped < 0.75 * rand
    assert grouped >= lens.sum()


def test_sharding_gives_disjoint_equal_batches():
    lens = _lengths(101)
    parts = [epoch_batches("length_grouped", lens, None, 8, 0, 0, rank=r, world=2) for r in range(2)]
    assert len(parts[0]) == len(parts[1])
    # the real batches are disjoint and cover every example; only a zero-weight Padding batch repeats
    real = [[i for b in part if not isinstance(b, Padding) for i in b] for part in parts]
    assert not set(real[0]) & set(real[1]) and sorted(real[0] + real[1]) == list(range(101))


def test_encode_and_collate(tiny_model_dir, quickstart_data):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    d = _load(f"data.train={quickstart_data['train']}", "data.columns.text=sentence", "data.columns.text_pair=sentence")
    enc = encode_table(d.train, tok, 24, ("text", "text_pair"), joint=True)
    assert len(enc) == len(d.train) and enc.lengths.max() <= 24
    again = encode_table(d.train, tok, 24, ("text", "text_pair"), joint=True)  # from the disk cache
    assert again.views == enc.views
    batch = collate(enc, [0, 5, 9], tok.pad_token_id)
    f = batch["features"][0]
    assert f["input_ids"].shape == f["attention_mask"].shape == f["token_type_ids"].shape
    assert f["input_ids"].shape[1] == max(enc.lengths[[0, 5, 9]])
    assert (f["token_type_ids"] == 1).any()  # pair encoding
    assert batch["labels"].tolist() == [d.train.columns["label"][i] for i in (0, 5, 9)]
    sep = encode_table(d.train, tok, 24, ("text", "text_pair"), joint=False)
    assert len(sep.views) == 2


def _collate_per_row(data, indices, pad_id):
    """The former row-by-row ``collate``: the reference the vectorised one must equal."""
    import torch

    def pad(rows, value):
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), value, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.as_tensor(r, dtype=torch.long)
            mask[i, : len(r)] = 1
        return ids, mask

    feats = []
    for v in data.views:
        ids, mask = pad([v["input_ids"][i] for i in indices], pad_id)
        f = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in v:
            f["token_type_ids"] = pad([v["token_type_ids"][i] for i in indices], 0)[0]
        feats.append(f)
    return feats


@pytest.mark.parametrize("seed", range(5))
def test_vectorised_collate_equals_per_row_padding(seed):
    import torch

    from finetune_cli.data.encode import EncodedData

    rng = np.random.default_rng(seed)
    n = 200
    views = []
    for _ in range(2):  # two views of different lengths per example
        ids = [rng.integers(1, 30000, rng.integers(1, 65)).tolist() for _ in range(n)]
        views.append({"input_ids": ids, "token_type_ids": [rng.integers(0, 2, len(r)).tolist() for r in ids]})
    lengths = np.max([[len(r) for r in v["input_ids"]] for v in views], axis=0)
    data = EncodedData(views, rng.integers(0, 3, n), lengths)
    for size in (1, 7, 32):
        idx = rng.choice(n, size, replace=False).tolist()
        got, want = collate(data, idx, pad_id=7), _collate_per_row(data, idx, 7)
        for g, w in zip(got["features"], want, strict=True):
            assert g.keys() == w.keys()
            for k in w:
                assert g[k].dtype == w[k].dtype and torch.equal(g[k], w[k]), k
        assert got["labels"].tolist() == data.labels[idx].tolist()
        assert got["index"].tolist() == idx


def test_collate_rounds_widths_to_buckets():
    from finetune_cli.data.encode import EncodedData, padded_width

    assert [padded_width(w, 16) for w in (1, 16, 17, 33)] == [16, 16, 32, 48]
    assert padded_width(40, 16, cap=41) == 41 and padded_width(50, 16, cap=41) == 50
    rows = [[5] * 3, [6] * 18]
    data = EncodedData([{"input_ids": rows}], None, np.array([3, 18]))
    f = collate(data, [0, 1], 0, pad_to_multiple=16)["features"][0]
    assert f["input_ids"].shape == (2, 32)
    assert f["attention_mask"].sum(1).tolist() == [3, 18]
    assert (f["input_ids"][0, 3:] == 0).all()


# ---- the one table reader ----------------------------------------------------------------------

def test_rows_are_numbered_as_the_file_is(tmp_path):
    from finetune_cli.data.sources import open_table

    j = tmp_path / "a.jsonl"
    j.write_text('{"text": "a"}\n\n{"text": "b"}\n{"text": "c"}\n')
    chunks = list(open_table(str(j)).chunks(2, ["text"]))
    assert [c.row_ids for c in chunks] == [[1, 3], [4]] and [c.columns["text"] for c in chunks] == [["a", "b"], ["c"]]
    c = tmp_path / "a.csv"
    c.write_text('text,label\n"two\nlines",x\n\nthree,y\n')
    t = read_file(str(c), {"text": "text", "label": "label"})
    assert t.columns["text"] == ["two\nlines", "three"] and t.row_ids == [2, 5]
    j.write_text('{"text": "a"}\n\n{"text": 3}\n')
    with pytest.raises(DataError, match=r"row 3 of .*a.jsonl has int 3 in text column `text`"):
        _load(f"data.train={j}", required=("text",), label_type=None)


def test_a_bad_byte_far_into_a_file_is_found_exactly(tmp_path):
    f = tmp_path / "big.tsv"
    head = "\ufeffsentence\tlabel\n" + "".join(f"caf\u00e9 number {i}\tpos\n" for i in range(60_000))
    data = head.encode() + b"bad \xe9 byte\tneg\n"
    f.write_bytes(data)
    with pytest.raises(DataError, match=rf"byte\(s\) e9 at byte offset {len(head.encode()) + 4} \(row 60002\)"):
        read_file(str(f), {"text": "sentence", "label": "label"})
    f.write_bytes(head[1:].encode("utf-16"))
    t = read_file(str(f), {"text": "sentence", "label": "label"}, encoding="utf-16")
    assert len(t) == 60_000 and t.columns["text"][0] == "caf\u00e9 number 0"


def test_refusals_name_what_they_refuse(tmp_path):
    import os

    f = tmp_path / "d.tsv"
    f.write_text("text\tlabel\ttext\na\tb\tc\n")
    with pytest.raises(DataError, match=r"column `text` appears twice in the header of .*d.tsv"):
        read_file(str(f), {"text": "text"})
    f.write_text("a\tb\n1\t2\n3\n")
    from finetune_cli.data.sources import open_table

    with pytest.raises(DataError, match=r"row 3 of .*d.tsv has 1 fields, expected 2"):
        list(open_table(str(f), header="yes").chunks())
    j = tmp_path / "d.json"
    j.write_text('[{"text": "a"}, ["text"]]')
    with pytest.raises(DataError, match=r"row 2 of .*d.json is not a JSON object"):
        read_file(str(j), {"text": "text"})
    with pytest.raises(DataError, match=r"data file .* is a directory"):
        read_file(str(tmp_path), {"text": "text"}, fmt="tsv")
    os.mkfifo(tmp_path / "p.tsv")
    with pytest.raises(DataError, match=r"p.tsv is not a regular file but a FIFO"):
        read_file(str(tmp_path / "p.tsv"), {"text": "text"})
