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
    rc = study.main(["--objectives", "nope_a,nope_b", "--anchors", "", "--data-dir", str(tmp_path), "--out", str(tmp_path / "o"),
                     "--results", str(tmp_path / "R.md")])
    err = capsys.readouterr().err
    assert rc == 2 and "`nope_a` skipped: objective `nope_a` is not registered" in err
    assert "none of the objectives is registered" in err and not (tmp_path / "R.md").exists()


def test_fewshot_rows_resolve_to_fewshot_recipes():
    study = load_study()
    assert study.base_recipe_name("ce", "fewshot", "ce") == "fewshot/ce"
    assert study.base_recipe_name("ce", "fewshot", "head") == "fewshot/head"
    assert study.base_recipe_name("ce", "fewshot", "ce_ls") == "fewshot/ce"
    assert study.base_recipe_name("r4f", "fewshot", "r4f") == "r4f"  # no few-shot recipe: the full-data one
    assert study.base_recipe_name("ce", "flat", "head") == "ce"
    assert study.row_objective("head", "head", "fewshot") == "ce"
    assert study.row_objective("head", "head", "flat") == "head"
    assert study.row_objective("ce_ls", "ce", "fewshot") == "ce"


def test_fewshot_recipes_keep_their_schedule_and_flat_gets_the_study_one(tmp_path):
    from finetune_cli.pipelines.recipes import load_recipe

    study = load_study()
    args = study.parse_args(["--out", str(tmp_path)])
    r = load_recipe("fewshot/ce", study.study_overrides(args, "ce", [], 20, tmp_path / "t.tsv", tmp_path / "s.tsv", "ce"))
    assert r.train.min_steps and r.train.min_evals and r.data.few_shot == 20 and r.train.batch_size == 16
    flat = study.parse_args(["--out", str(tmp_path), "--recipes", "flat"])
    assert flat.objectives == study.FLAT_OBJECTIVES
    r = load_recipe("ce", study.study_overrides(flat, "ce", [], 20, tmp_path / "t.tsv", tmp_path / "s.tsv", "ce"))
    assert (r.train.epochs, r.train.batch_size, r.train.lr, r.train.min_steps, r.train.eval_every) == (
        10, 16, 5e-5, None, None)
    ov = study.study_overrides(study.parse_args(["--out", str(tmp_path), "--max-steps", "7"]), "ce", [], 20,
                               tmp_path / "t.tsv", tmp_path / "s.tsv", "ce")
    r = load_recipe("fewshot/ce", ov)
    assert r.train.max_steps == 7 and r.train.min_steps is None


def test_anchor_metrics_and_pairing():
    import numpy as np

    study = load_study()
    fa = study.fa
    proba = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
    r = fa.classification_result(proba, np.array([0, 0, 1, 1]), proba=True)
    assert r["accuracy"] == 0.75 and r["pred_neg_share"] == 0.75 and 0 <= r["ece"] <= 1
    c = fa.paired({1: 0.7, 2: 0.8, 3: 0.6}, {1: 0.6, 2: 0.7, 3: 0.65})
    assert c["n"] == 3 and c["wins"] == 2 and abs(c["diff"] - 0.05) < 1e-12


def test_probe_anchor_runs_on_the_draw_of_the_seed(tmp_path, tiny_model_dir):
    """The probe trains on exactly the examples ``finetune train --seeds`` draws for that seed."""
    import numpy as np

    from finetune_cli.pipelines.recipes import load_recipe

    study = load_study()
    fa = study.fa
    (tmp_path / "SST-2").mkdir()
    rows = [f"awful dull bad {i}\t0" for i in range(30)] + [f"great fun good {i}\t1" for i in range(30)]
    (tmp_path / "SST-2" / "train.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    fake_dev(tmp_path / "dev.tsv")
    args = study.parse_args(["--out", str(tmp_path / "o"), "--model", str(tiny_model_dir)])
    recipe = load_recipe("fewshot/ce", study.study_overrides(args, "ce", [], 4, tmp_path / "SST-2" / "train.tsv",
                                                              tmp_path / "dev.tsv", "ce"))
    a = fa.seed_data(recipe, 3, tmp_path).train.columns["text"]
    assert len(a) == 8 and a == fa.seed_data(recipe, 3, tmp_path).train.columns["text"]
    assert a != fa.seed_data(recipe, 4, tmp_path).train.columns["text"]
    emb = fa.Embedder(str(tiny_model_dir), 32)
    recs = fa.run_anchor("probe", recipe, [3], tmp_path, tmp_path / "dev.tsv", tmp_path / "dev.tsv", {},
                         tmp_path / "probe", lambda: emb, study.cpu_seconds, lambda *_: None)
    m = recs[0]["metrics"]
    assert recs[0]["train_examples"] == 8 and set(m) == {"test", "select"}
    assert 0 <= m["test"]["accuracy"] <= 1 and np.isfinite(m["test"]["ece"])
    again = fa.run_anchor("probe", recipe, [3], tmp_path, tmp_path / "dev.tsv", tmp_path / "dev.tsv", {},
                          tmp_path / "probe", lambda: None, study.cpu_seconds, lambda *_: None)
    assert again == recs  # reused from result.json, nothing recomputed
