"""``data.eval_fraction``: an evaluation split carved from the training file, stratified, seeded,
recorded in the run folder and checked on resume."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from finetune_cli.data.tasks import stratified_eval_indices
from tests.unit._cli import invoke, one_error_line


def test_stratified_indices_keep_class_shares_and_follow_the_seed():
    labels = [0] * 70 + [1] * 20 + [2] * 10
    idx = stratified_eval_indices(labels, 100, 0.1, seed=3)
    assert Counter(labels[i] for i in idx) == {0: 7, 1: 2, 2: 1}
    assert idx == stratified_eval_indices(labels, 100, 0.1, seed=3)
    assert idx != stratified_eval_indices(labels, 100, 0.1, seed=4)
    # largest remainders: 0.25 of (5, 3, 2) = 1.25, 0.75, 0.5 -> round(2.5)=2 rows: 1 of class 0, 1 of class 1
    small = [0] * 5 + [1] * 3 + [2] * 2
    got = Counter(small[i] for i in stratified_eval_indices(small, 10, 0.25, seed=0))
    assert sum(got.values()) == round(0.25 * 10) and got[1] == 1 and got[0] == 1


def _recipe(tiny_recipe, *extra):
    return [*(o for o in tiny_recipe(*extra) if not o.startswith(("data.eval=", "data.max_train_samples"))),
            "~data.eval"]


def test_train_carves_and_records_the_split_then_refuses_a_changed_file(tiny_recipe, tmp_path, quickstart_data):
    rows = open(quickstart_data["train"], encoding="utf-8").read().splitlines()
    train = tmp_path / "train.tsv"
    train.write_text("\n".join(rows[:121]) + "\n", encoding="utf-8")  # header + 120 rows
    args = ["-r", "quickstart", *_recipe(tiny_recipe, f"data.train={train}", "data.eval_fraction=0.25",
                                         "train.save_every=2", "train.max_steps=4"), "--device", "cpu", "-q"]
    res = invoke("train", *args, "--json")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert (summary["train_examples"], summary["eval_examples"]) == (90, 30)
    run = tmp_path / "runs" / "tiny"
    split = json.loads((run / "split.json").read_text())
    assert len(split["eval_rows"]) == 30 and not set(split["eval_rows"]) & set(split["train_rows"])
    assert sorted(split["eval_rows"] + split["train_rows"]) == list(range(2, 122))  # file line numbers
    labels = [ln.split("\t")[1] for ln in rows[1:121]]
    ev = Counter(labels[r - 2] for r in split["eval_rows"])
    whole = Counter(labels)
    for lab, n in whole.items():  # each class's share within one row of a quarter
        assert abs(ev[lab] - n / 4) <= 1
    # the training file changes under a run that resumes: its split no longer matches -> refused
    (run / "summary.json").unlink()
    train.write_text("\n".join([rows[0], *reversed(rows[1:121])]) + "\n", encoding="utf-8")
    res = invoke("train", *args)
    assert res.exit_code != 0
    assert "split.json records another evaluation split" in one_error_line(res)


@pytest.mark.parametrize("override, message", [
    ("data.validation_split=0.1", "did you mean `data.eval_fraction`?"),
    ("data.eval_fraction=1.5", "`data.eval_fraction`"),
])
def test_bad_keys_point_to_eval_fraction(tiny_recipe, override, message):
    res = invoke("train", "-r", "quickstart", *tiny_recipe(override))
    assert res.exit_code != 0
    assert message in one_error_line(res)


def test_eval_fraction_and_eval_file_are_exclusive(tiny_recipe):
    res = invoke("train", "-r", "quickstart", *tiny_recipe("data.eval_fraction=0.1"))
    assert res.exit_code != 0
    assert "`data.eval_fraction` and `data.eval`" in one_error_line(res)


def test_too_few_rows_is_one_line(tiny_recipe, tmp_path, quickstart_data):
    rows = open(quickstart_data["train"], encoding="utf-8").read().splitlines()
    train = tmp_path / "three.tsv"
    by_label = {ln.split("\t")[1]: ln for ln in rows[1:]}  # one row of each class
    train.write_text("\n".join([rows[0], *by_label.values(), *by_label.values()]) + "\n", encoding="utf-8")
    res = invoke("train", "-r", "quickstart", *_recipe(tiny_recipe, f"data.train={train}", "data.eval_fraction=0.1"))
    assert res.exit_code != 0
    assert "leaves no evaluation rows" in one_error_line(res)
