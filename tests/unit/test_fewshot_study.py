"""The few-shot study script: the deterministic dev split, objective specs, unregistered objectives."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def load_study():
    spec = importlib.util.spec_from_file_location("fewshot_sst2", REPO / "experiments" / "fewshot_sst2.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def fake_dev(path: Path, n_neg: int = 7, n_pos: int = 10) -> list[str]:
    rows = [f"bad {i}\t0" for i in range(n_neg)] + [f"good {i}\t1" for i in range(n_pos)]
    path.write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    return rows


def test_dev_split_is_stratified_disjoint_and_deterministic(tmp_path):
    study = load_study()
    rows = fake_dev(tmp_path / "dev.tsv")
    sel, test = study.split_dev(tmp_path / "dev.tsv", tmp_path / "out")
    a = sel.read_text().splitlines()
    b = test.read_text().splitlines()
    assert a[0] == b[0] == "sentence\tlabel"
    assert sorted(a[1:] + b[1:]) == sorted(rows) and not set(a[1:]) & set(b[1:])
    # floor(n/2) of each label to selection: 3 of 7 negatives, 5 of 10 positives
    assert sum(r.endswith("\t0") for r in a[1:]) == 3 and sum(r.endswith("\t1") for r in a[1:]) == 5
    before = (sel.read_text(), test.read_text())
    study.split_dev(tmp_path / "dev.tsv", tmp_path / "out2")
    assert ((tmp_path / "out2" / "dev_select.tsv").read_text(), (tmp_path / "out2" / "dev_test.tsv").read_text()) == before


def test_objective_specs():
    study = load_study()
    assert study.parse_objectives("ce, ce_ls:ce:label_smoothing=0.1") == [
        ("ce", "ce", []), ("ce_ls", "ce", ["objective.label_smoothing=0.1"])]
    assert study.base_recipe_name("ce") == "ce" and study.base_recipe_name("no_such_objective") == "ce"


def test_unregistered_objectives_are_skipped_with_a_note(tmp_path, capsys):
    study = load_study()
    (tmp_path / "SST-2").mkdir()
    fake_dev(tmp_path / "SST-2" / "dev.tsv")
    fake_dev(tmp_path / "SST-2" / "train.tsv")
    rc = study.main(["--objectives", "nope_a,nope_b", "--data-dir", str(tmp_path), "--out", str(tmp_path / "o"),
                     "--results", str(tmp_path / "R.md")])
    err = capsys.readouterr().err
    assert rc == 2 and "`nope_a` skipped: objective `nope_a` is not registered" in err
    assert "none of the objectives is registered" in err and not (tmp_path / "R.md").exists()
