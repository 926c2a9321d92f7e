"""The few-shot study script: task splits, shared draws, pairs, rows, and its smallest configuration end to end."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def load_study():
    sys.path.insert(0, str(REPO / "experiments"))
    spec = importlib.util.spec_from_file_location("fewshot_study", REPO / "experiments" / "fewshot_study.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fewshot_study"] = mod
    spec.loader.exec_module(mod)
    return mod


def fake_data(root: Path, n_train: int = 30, n_dev: int = 17) -> Path:
    """A data folder with an SST-2-like single-text task, an MRPC-like pair task and a one-file yelp."""
    (root / "SST-2").mkdir(parents=True)
    for name, n in (("train.tsv", n_train), ("dev.tsv", n_dev)):
        rows = [f"awful dull bad {name} {i}\t0" if i % 2 else f"great fun good {name} {i}\t1" for i in range(n)]
        (root / "SST-2" / name).write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    (root / "MRPC").mkdir()
    for name, n in (("train.tsv", n_train), ("dev.tsv", n_dev)):
        rows = [f"{i % 2}\t{i}\t{i + 1}\tthe cat sat {i}\t" + ("the cat sat" if i % 2 else f"dogs run far {i}")
                for i in range(n)]
        (root / "MRPC" / name).write_text("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n" + "\n".join(rows) + "\n")
    (root / "sentiment-ood" / "yelp").mkdir(parents=True)
    rows = [f"bad {i}\t0" for i in range(700)] + [f"good {i}\t1" for i in range(700)]
    (root / "sentiment-ood" / "yelp" / "dev.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    return root


def jsonl(p: Path) -> list[dict]:
    return [json.loads(ln) for ln in p.read_text().splitlines()]


def test_task_splits_are_stratified_disjoint_and_deterministic(tmp_path):
    study = load_study()
    data = fake_data(tmp_path / "d")
    f = study.prepare_task("sst2", data, tmp_path / "o")
    sel, test = jsonl(f["select"]), jsonl(f["test"])
    assert len(jsonl(f["train"])) == 30 and len(sel) + len(test) == 17
    assert {r["text"] for r in sel}.isdisjoint(r["text"] for r in test)
    # floor(n/2) of each label to selection: 8 negatives, 9 positives -> 4 + 4
    assert sum(r["label"] == "0" for r in sel) == 4 and sum(r["label"] == "1" for r in sel) == 4
    before = {k: p.read_text() for k, p in f.items()}
    again = study.prepare_task("sst2", data, tmp_path / "o2")
    assert {k: p.read_text() for k, p in again.items()} == before


def test_one_file_task_loses_a_stratified_dev_pool_to_train_from_the_rest(tmp_path):
    study = load_study()
    f = study.prepare_task("yelp", fake_data(tmp_path / "d"), tmp_path / "o")
    train, sel, test = (jsonl(f[k]) for k in ("train", "select", "test"))
    assert len(sel) + len(test) == study.DEV_POOL and len(train) == 1400 - study.DEV_POOL
    assert sum(r["label"] == "0" for r in sel + test) == study.DEV_POOL // 2
    assert not {r["text"] for r in train} & {r["text"] for r in sel + test}


def test_pair_task_keeps_both_texts_and_anchors_read_them_joined(tmp_path):
    study = load_study()
    f = study.prepare_task("mrpc", fake_data(tmp_path / "d"), tmp_path / "o")
    row = jsonl(f["train"])[1]
    assert row == {"text": "the cat sat 1", "text_pair": "the cat sat", "label": "1"}
    texts, y = study.fa.read_labelled(f["train"], ["0", "1"], "[SEP]")
    assert texts[1] == "the cat sat 1 [SEP] the cat sat" and y[1] == 1
    assert study.fa.join_pair(["a"], None, "[SEP]") == ["a"]


def test_rows_resolve_to_fewshot_recipes_with_variants(tmp_path):
    from finetune_cli.pipelines.recipes import load_recipe

    study = load_study()
    rows = study.parse_objectives("ce, scl1:scl:views=1:crop=0.5:train.min_steps=100")
    assert rows == [("ce", "ce", []), ("scl1", "scl", ["objective.views=1", "objective.crop=0.5",
                                                       "train.min_steps=100"])]
    assert study.recipe_name("scl") == "fewshot/scl" and study.recipe_name("r4f") == "r4f"
    f = study.prepare_task("mrpc", fake_data(tmp_path / "d"), tmp_path / "o")
    args = study.parse_args(["--out", str(tmp_path / "o")])
    r = load_recipe("fewshot/scl", study.study_overrides(args, "scl", rows[1][2], "mrpc", 8, f, "scl1"))
    assert (r.objective.params["views"], r.train.min_steps, r.data.few_shot, r.model.max_length) == (1, 100, 8, 128)
    assert r.data.columns.text_pair == "text_pair" and r.data.eval == str(f["select"])
    assert r.run_dir == tmp_path / "o" / "mrpc" / "n8" / "scl1"


def test_unknown_task_and_unregistered_rows_are_refused(tmp_path, capsys):
    study = load_study()
    assert study.main(["--tasks", "sst2,nope", "--out", str(tmp_path)]) == 2
    assert "unknown task(s) nope" in capsys.readouterr().err
    rc = study.main(["--tasks", "sst2", "--objectives", "nope_a", "--anchors", "", "--data-dir",
                     str(fake_data(tmp_path / "d")), "--out", str(tmp_path / "o"), "--results", str(tmp_path / "R.md")])
    err = capsys.readouterr().err
    assert rc == 2 and "`nope_a` skipped: objective `nope_a` is not registered" in err
    assert not (tmp_path / "R.md").exists()


def test_anchor_metrics_and_pairing():
    import numpy as np

    fa = load_study().fa
    r = fa.classification_result(np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]]), np.array([0, 0, 1, 1]),
                                 proba=True)
    assert r["accuracy"] == 0.75 and r["pred_neg_share"] == 0.75 and 0 <= r["ece"] <= 1
    c = fa.paired({1: 0.7, 2: 0.8, 3: 0.6, 4: 0.5}, {1: 0.6, 2: 0.7, 3: 0.65, 4: 0.5})
    assert (c["n"], c["wins"], c["ties"], c["losses"]) == (4, 2, 1, 1) and abs(c["diff"] - 0.0375) < 1e-12


def test_smallest_study_runs_end_to_end(tmp_path, tiny_model_dir):
    """The CI configuration: tiny model, a single-text and a pair task, 1 seed, both anchors; every row of
    a seed trains on the same draw, and a rerun reuses every run."""
    study = load_study()
    data = fake_data(tmp_path / "d")
    anchors = "probe" + ("" if study.fa.setfit_available() else ",setfit")
    argv = ["--tasks", "sst2,mrpc", "--shots", "2", "--seeds", "1", "--objectives", "ce,scl,fastfit", "--anchors", anchors,
            "--max-steps", "2", "--model", str(tiny_model_dir), "--data-dir", str(data), "--out", str(tmp_path / "o"),
            "--results", str(tmp_path / "R.md"), "--no-figures", "--quiet", "--device", "cpu",
            "--ledger", str(tmp_path / "ledger.jsonl")]
    assert study.main(argv) == 0
    page = (tmp_path / "R.md").read_text()
    assert "REDUCED RUN" in page and "### mrpc" in page and "## Averages over tasks" in page
    assert "| scl − probe | 1 |" in page and "pair tasks acc" in page
    drawn = {}
    for row in ["ce", "scl", "fastfit"]:
        run = tmp_path / "o" / "mrpc" / "n2" / row / "seed-1"
        drawn[row] = json.loads((run / "eval.json").read_text())["data"]
        assert drawn[row].endswith("test.jsonl")
    probe = json.loads((tmp_path / "o" / "mrpc" / "n2" / "probe" / "seed-1" / "result.json").read_text())
    assert probe["train_examples"] == 4 and set(probe["metrics"]) == {"test", "select"}
    before = page
    assert study.main(argv) == 0 and (tmp_path / "R.md").read_text() == before  # all reused, same page


@pytest.mark.parametrize("task", ["sst2", "mrpc"])
def test_anchor_and_recipe_draw_the_same_examples(tmp_path, task):
    from finetune_cli.pipelines.recipes import load_recipe

    study = load_study()
    f = study.prepare_task(task, fake_data(tmp_path / "d"), tmp_path / "o")
    args = study.parse_args(["--out", str(tmp_path / "o")])
    ce = load_recipe("fewshot/ce", study.study_overrides(args, "ce", [], task, 4, f, "ce"))
    scl = load_recipe("fewshot/scl", study.study_overrides(args, "scl", [], task, 4, f, "scl"))
    a, b = study.fa.seed_data(ce, 3).train, study.fa.seed_data(scl, 3).train
    assert len(a.columns["text"]) == 8 and a.columns == b.columns
    assert a.columns["text"] != study.fa.seed_data(ce, 4).train.columns["text"]


def test_ledger_keeps_every_cell_so_a_fresh_checkout_rewrites_the_page_and_a_changed_recipe_retrains(
        tmp_path, tiny_model_dir):
    """The ledger alone (no run folder) gives the same page; a recipe change is a new cell, not a reused one."""
    study = load_study()
    data, ledger = fake_data(tmp_path / "d"), tmp_path / "ledger.jsonl"

    def argv(out, *more):
        return ["--tasks", "sst2", "--shots", "2", "--seeds", "1,2", "--objectives", "ce", "--anchors", "probe",
                "--max-steps", "2", "--model", str(tiny_model_dir), "--data-dir", str(data), "--out", str(out),
                "--results", str(out / "R.md"), "--no-figures", "--quiet", "--device", "cpu", "--ledger", str(ledger),
                *more]

    assert study.main(argv(tmp_path / "o1")) == 0
    cells = jsonl(ledger)
    assert sorted((c["row"], c["seed"]) for c in cells) == [("ce", 1), ("ce", 2), ("probe", 1), ("probe", 2)]
    assert all({"made", "commit", "threads", "load1", "fp"} <= set(c) for c in cells)
    assert all(0 <= c["record"]["test"]["accuracy"] <= 1 for c in cells)

    # a fresh out folder: nothing to reuse but the ledger; --report-only trains nothing and reports every cell
    assert study.main(argv(tmp_path / "o2", "--report-only", "--no-times")) == 0
    page = (tmp_path / "o2" / "R.md").read_text()
    assert not (tmp_path / "o2" / "sst2" / "n2" / "ce").exists() and len(jsonl(ledger)) == 4
    assert "Written from the ledger" in page and "- N = 2: sst2 1,2" in page and "wall s" not in page
    first = (tmp_path / "o1" / "R.md").read_text()
    row = next(ln for ln in first.splitlines() if ln.startswith("| ce | 2 |"))
    assert row.rsplit("|", 3)[0] in page  # the same accuracy cells, times left off

    # another recipe value is another cell: trained, appended, the old cells kept
    assert study.main(argv(tmp_path / "o3", "--set", "train.lr=3e-5", "--seeds", "1")) == 0
    after = jsonl(ledger)
    assert len(after) == 5 and after[-1]["row"] == "ce" and after[-1]["fp"] != cells[0]["fp"]
    assert (tmp_path / "o3" / "sst2" / "n2" / "ce" / "seed-1" / "summary.json").is_file()


def test_a_damaged_ledger_line_stops_the_study_naming_the_line(tmp_path):
    study = load_study()
    f = tmp_path / "ledger.jsonl"
    f.write_text('{"task": "sst2", "n": 8, "row": "ce", "seed": 1, "fp": "x", "record": {}}\n{"task": "sst2"\n')
    with pytest.raises(SystemExit, match=r"ledger.jsonl:2: not a ledger line"):
        study.Ledger(f)
    assert study.Ledger(tmp_path / "none.jsonl").cells == {}


def test_only_protocol_runs_default_to_the_repository_ledger(tmp_path):
    study = load_study()
    out = ["--out", str(tmp_path / "o")]
    assert study.ledger_path(study.parse_args(out)) == study.LEDGER
    assert study.ledger_path(study.parse_args([*out, "--objectives", "scl1:scl:views=1"])) == study.LEDGER
    for smoke in (["--max-steps", "2"], ["--max-length", "32"], ["--set", "train.lr=1e-4"], ["--model", "x"]):
        assert study.ledger_path(study.parse_args([*out, *smoke])) == tmp_path / "o" / "ledger.jsonl"
    assert study.ledger_path(study.parse_args([*out, "--max-steps", "2", "--ledger", "L.jsonl"])) == Path("L.jsonl")


def test_the_page_keeps_only_seeds_that_every_row_of_a_task_has():
    load_study()
    import fewshot_report as fr

    rec = {"test": {"accuracy": 0.5}, "select": 0.5, "wall_s": 1.0, "cpu_s": 1.0}
    results = {"sst2": {8: {"ce": {1: rec, 2: rec, 3: rec}, "setfit": {1: rec, 2: rec}}},
               "mrpc": {8: {"ce": {1: rec}, "setfit": {2: rec}}}}
    kept = fr.paired_seeds(results)
    assert {r: sorted(v) for r, v in kept["sst2"][8].items()} == {"ce": [1, 2], "setfit": [1, 2]}
    assert kept["mrpc"][8] == {}
    assert fr.coverage(kept, [8])[2] == "- N = 8: sst2 1,2"


def test_averages_at_an_n_are_over_the_tasks_that_have_cells_at_that_n():
    """A study run in parts: N = 64 on one task only still gets its averages (over that task), and a row
    that ran at N = 8 alone is not listed at N = 64 as a row of dashes."""
    load_study()
    import fewshot_report as fr

    def rec(a):
        return {"test": {"accuracy": a}, "select": a, "wall_s": 1.0, "cpu_s": 1.0}

    results = {"sst2": {8: {"ce": {1: rec(0.7)}, "ce50": {1: rec(0.72)}, "probe": {1: rec(0.6)}, "setfit": {1: rec(0.65)}},
                        64: {"ce": {1: rec(0.8)}, "probe": {1: rec(0.7)}, "setfit": {1: rec(0.75)}}},
               "mrpc": {8: {"ce": {1: rec(0.5)}, "ce50": {1: rec(0.56)}, "probe": {1: rec(0.4)}, "setfit": {1: rec(0.45)}}}}
    page = fr.summary(results, [8, 64], ["ce", "ce50", "probe", "setfit"], times=False)
    n64 = page[page.index("### N = 64 per class"):]
    assert n64[2] == "Tasks: sentiment tasks 1; all tasks 1."
    ce64 = next(ln for ln in n64 if ln.startswith("| ce |"))
    assert ce64 == "| ce | 80.0 | 80.0 | +5.0 | +5.0 | +10.0 | 80.0 |"
    assert not any(ln.startswith("| ce50 |") for ln in n64)
    n8 = page[page.index("### N = 8 per class"):page.index("### N = 64 per class")]
    assert n8[2] == "Tasks: sentiment tasks 1; pair tasks 1; all tasks 2."
    assert next(ln for ln in n8 if ln.startswith("| ce50 |")) == "| ce50 | 72.0 | 56.0 | 64.0 | +7.0 | +11.0 | +9.0 | +14.0 | 64.0 |"


@pytest.mark.parametrize("page_name", ["few-shot-results.md", "few-shot-fastfit.md"])
@pytest.mark.parametrize("setfit_installed", [True, False], ids=["setfit", "no-setfit"])
def test_the_committed_results_page_is_what_the_committed_ledger_gives(tmp_path, monkeypatch, setfit_installed,
                                                                       page_name):
    """docs/few-shot-results.md is regenerated, never edited: its own command, run on the repository's ledger
    and the shared data, writes the same page (so every number the docs quote from it is reproducible), also
    where SetFit is not installed (CI's machine: --report-only reads SetFit's cells, it never runs SetFit)."""
    import shlex

    if setfit_installed:
        pytest.importorskip("setfit")
    else:
        monkeypatch.setitem(sys.modules, "setfit", None)  # `import setfit` raises ImportError, as without the extra

    from tests.conftest import shared_data_or_skip

    data = shared_data_or_skip()
    page = (REPO / "docs" / page_name).read_text(encoding="utf-8")
    lines = page.splitlines()
    cmd = lines[lines.index("```") + 1]
    argv = shlex.split(cmd)
    assert argv[:2] == ["python", "experiments/fewshot_study.py"] and "--report-only" in argv
    argv = argv[2:]
    argv[argv.index("--results") + 1] = str(tmp_path / "R.md")
    study = load_study()
    assert study.main([*argv, "--data-dir", str(data), "--out", str(tmp_path / "o")]) == 0
    again = (tmp_path / "R.md").read_text(encoding="utf-8").replace(str(tmp_path / "R.md"), f"docs/{page_name}")
    again = again.replace(f" --data-dir {data} --out {tmp_path / 'o'}", "")
    assert again == page


@pytest.mark.parametrize("task,classes", [("emotion", 6), ("sst5", 5)])
def test_multiclass_tasks_load_with_their_class_names(tmp_path, task, classes):
    """The shared data's multi-class tasks split like the others, their labels are the ids 0..C-1 that
    the class names are listed for, and only a row that encodes the label texts is given the names."""
    from tests.conftest import shared_data_or_skip

    study = load_study()
    t = study.TASKS[task]
    data = shared_data_or_skip(t.folder).parent
    f = study.prepare_task(task, data, tmp_path / "o")
    train, sel = jsonl(f["train"]), jsonl(f["select"])
    assert t.group == "multiclass" and len(t.classes) == classes
    assert {r["label"] for r in train} == {r["label"] for r in sel} == {str(i) for i in range(classes)}
    listed = (data / t.folder / "labels.txt").read_text().lower()
    assert all(c in listed for c in t.classes)
    args = study.parse_args(["--out", str(tmp_path / "o")])
    over = study.study_overrides(args, "fastfit", [], task, 8, f, "fastfit")
    names = json.loads(next(o for o in over if o.startswith("data.label_descriptions=")).split("=", 1)[1])
    assert names == {str(i): c for i, c in enumerate(t.classes)}
    assert not any(o.startswith("data.label_descriptions") for o in study.study_overrides(args, "ce", [], task, 8, f, "ce"))
    from finetune_cli.pipelines.recipes import load_plan

    load_plan("fewshot/fastfit", over)  # the row's recipe validates with the names


def test_cost_bench_interleaves_every_recipe_with_setfit_at_every_n(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """bench/fewshot_cost.py (smoke size): every configuration, SetFit first, at each N, a row each with
    its paired ratio to SetFit; SetFit itself is stubbed here (a sleep) where it is not installed."""
    import time as _time

    study = load_study()
    spec = importlib.util.spec_from_file_location("fewshot_cost", REPO / "bench" / "fewshot_cost.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    calls = []

    def fake_setfit(texts, labels, evals, model_path, seed, max_length, **kw):
        calls.append((len(texts), seed))
        _time.sleep(0.05)
        return {k: {"accuracy": 0.5} for k in evals}

    monkeypatch.setattr(study.fa, "run_setfit", fake_setfit)
    bench.fs = study
    data = fake_data(tmp_path / "d")
    out_json = tmp_path / "cost.json"
    assert bench.main(["--tasks", "sst2", "--shots", "2,3", "--rounds", "2", "--configs", "ce,fastfit",
                       "--max-steps", "2", "--model", str(tiny_model_dir), "--data-dir", str(data),
                       "--json", str(out_json)]) == 0
    assert sorted(calls) == [(4, 1), (4, 2), (6, 1), (6, 2)]  # N a class x 2 classes, one draw per round
    runs = json.loads(out_json.read_text())["runs"]
    assert set(runs) == {"sst2/n2", "sst2/n3"}
    for cell in runs.values():
        assert set(cell) == {"setfit", "ce", "fastfit"} and all(len(v) == 2 for v in cell.values())
        assert all(r["steps"] == 2 for row in ("ce", "fastfit") for r in cell[row])
    printed = capsys.readouterr().out
    assert "sst2, N = 2 a class, 2 rounds" in printed and "sst2, N = 3 a class, 2 rounds" in printed
    assert printed.count("| ce |") == 2 and printed.count("| setfit |") == 2
    assert "| setfit | " in printed and " 1.00 (1.00–1.00) |" in printed  # SetFit's ratio to itself
