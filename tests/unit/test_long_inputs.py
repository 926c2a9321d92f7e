"""Rows longer than the length: counted and reported by every command, cut by ``model.truncation``
(head, tail, head_tail) saved with the model, or read in overlapping windows (``--stride``)."""

from __future__ import annotations

import csv
import json
import random

import numpy as np
import pytest
import torch

from finetune_cli.data.encode import _tokenize, shares
from finetune_cli.data.sources import Table
from finetune_cli.engine.inference import open_session
from finetune_cli.metrics.tasks import softmax
from tests.unit._cli import invoke, one_error_line

WORDS = "the a cat dog sat on mat quickly running house tree green river".split()


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from finetune_cli.models.loading import embedded_model_path

    return AutoTokenizer.from_pretrained(embedded_model_path())


def _texts(n: int, seed: int, longest: int = 30) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, longest))) for _ in range(n)]


@pytest.mark.parametrize("max_length", [6, 9, 17])
def test_head_and_tail_are_what_tokenizers_cut(tokenizer, max_length):
    """head = tokenizers' truncation (longest_first for a pair, the same tie rule); tail = its
    truncation_side='left' on single texts."""
    a, b = _texts(150, max_length), _texts(150, max_length + 1)
    for pair in (None, b):
        out, long, _ = _tokenize(tokenizer, a, pair, max_length, "head")
        ref = tokenizer(a, pair, truncation=True, max_length=max_length)
        assert out["input_ids"] == ref["input_ids"] and out["token_type_ids"] == ref["token_type_ids"]
        whole = tokenizer(a, pair)["input_ids"]
        assert long.tolist() == [len(x) > max_length for x in whole] and long.any() and not long.all()
    tokenizer.truncation_side = "left"
    try:
        ref = tokenizer(a, truncation=True, max_length=max_length)["input_ids"]
    finally:
        tokenizer.truncation_side = "right"
    assert _tokenize(tokenizer, a, None, max_length, "tail")[0]["input_ids"] == ref


def test_head_tail_keeps_the_first_quarter_and_the_last_three(tokenizer):
    a = _texts(60, 1, longest=40)
    max_length = 22  # 20 text tokens: the first 5 and the last 15 (Sun et al.: 128 + 382 of 510)
    out = _tokenize(tokenizer, a, None, max_length, "head_tail")[0]["input_ids"]
    for text, ids in zip(a, out, strict=True):
        content = tokenizer(text, add_special_tokens=False)["input_ids"]
        kept = content if len(content) <= 20 else content[:5] + content[-15:]
        assert ids == [tokenizer.cls_token_id, *kept, tokenizer.sep_token_id]
    # a pair: each text's longest_first share, each cut head+tail
    a2, b2 = "one two three four five six seven eight nine ten", "red green blue"
    ids = _tokenize(tokenizer, [a2], [b2], 11, "head_tail")[0]["input_ids"][0]
    ca, cb = (tokenizer(x, add_special_tokens=False)["input_ids"] for x in (a2, b2))
    na, nb = shares([len(ca), len(cb)], 8)
    assert (na, nb) == (5, 3)
    assert ids == [101, *ca[:1], *ca[-4:], 102, *cb, 102]


def _write(path, texts, labels=None):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"] if labels else ["text"])
        for i, t in enumerate(texts):
            w.writerow([t, labels[i]] if labels else [t])


def _window_loop(sess, text: str, max_length: int, stride: int) -> np.ndarray:
    """The reference: every window run on its own, logits averaged (plain loop)."""
    tok = sess.tokenizer
    content = tok(text, add_special_tokens=False)["input_ids"]
    budget = max_length - 2
    starts = [0]
    while starts[-1] + budget < len(content):
        starts.append(starts[-1] + budget - stride)
    logits = []
    for s in starts:
        ids = torch.tensor([[tok.cls_token_id, *content[s:s + budget], tok.sep_token_id]])
        feats = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
        with torch.inference_mode():
            logits.append(sess.model(feats).logits[0].double().numpy())
    return np.mean(logits, axis=0)


def test_commands_report_cut_rows_truncation_is_saved_and_stride_averages_windows(tiny_recipe, tmp_path):
    res = invoke("train", "-r", "quickstart", *tiny_recipe("model.max_length=12", "model.truncation=head_tail",
                                                           "train.max_steps=2"), "--device", "cpu")
    assert res.exit_code == 0, res.output
    assert "rows longer than model.max_length=12 were cut (model.truncation=head_tail)" in res.stderr
    assert res.stderr.count("were cut") == 2  # the training and the evaluation data
    best = tmp_path / "runs" / "tiny" / "best"
    assert json.loads((best / "finetune_model.json").read_text())["truncation"] == "head_tail"

    texts = _texts(20, 7, longest=60)
    src = tmp_path / "in.csv"
    _write(src, texts)
    outs = {}
    for name, extra in (("saved", []), ("head_tail", ["--truncation", "head_tail"]), ("head", ["--truncation", "head"]),
                        ("stride", ["--stride", "3"])):
        out = tmp_path / f"{name}.jsonl"
        r = invoke("predict", best, "-i", src, "-o", out, "--device", "cpu", "--max-length", "12", *extra)
        assert r.exit_code == 0, r.output
        outs[name] = [json.loads(ln) for ln in out.read_text().splitlines()]
        n_long = sum(len(t.split()) > 10 for t in texts)  # every word is one token here
        if name == "stride":
            assert f"{n_long} of 20 rows longer than --max-length=12 were read in" in r.stderr
        else:
            rule = "head_tail" if name == "saved" else name
            assert f"{n_long} of 20 rows longer than --max-length=12 were cut (truncation={rule})" in r.stderr
    probs = {k: np.array([[row["prob_negative"], row["prob_positive"]] for row in v]) for k, v in outs.items()}
    assert np.array_equal(probs["saved"], probs["head_tail"])  # the saved rule is the default
    assert not np.allclose(probs["head"], probs["head_tail"])

    sess = open_session(str(best), device="cpu", precision="fp32", max_length=12)
    ref = softmax(np.stack([_window_loop(sess, t, 12, 3) for t in texts]))
    np.testing.assert_allclose(probs["stride"], ref, atol=1e-5)


def test_stride_is_refused_for_pairs_and_for_too_wide_windows(tiny_recipe, tmp_path, tiny_model_dir):
    src = tmp_path / "pairs.csv"
    src.write_text("text,other\nsome words here,more words\n", encoding="utf-8")
    r = invoke("predict", tiny_model_dir, "-i", src, "-o", tmp_path / "o.csv", "--pair-column", "other",
               "--stride", "4")
    assert r.exit_code != 0 and "a sentence pair (--pair-column) is cut by --truncation" in one_error_line(r)
    tok_session = open_session(str(tiny_model_dir), device="cpu", max_length=8)
    with pytest.raises(Exception, match="--stride 6 must be below the text tokens a window holds"):
        tok_session.encode(Table({"text": [" ".join(["dog"] * 20)]}, "<t>"), ("text",), joint=False, stride=6)
