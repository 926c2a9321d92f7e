"""`finetune sweep`: parameter specs, a 3-trial 2-seed study on the tiny model that resumes after an
interruption without re-running finished trials, and a best recipe that validates."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from finetune_cli.cli.main import app
from finetune_cli.engine.search import ParamSpec, override, parse_param
from finetune_cli.pipelines.recipes import load_recipe
from finetune_cli.recipe import RecipeError

pytest.importorskip("optuna")
runner = CliRunner()


def test_parse_param_forms():
    assert parse_param("train.lr=loguniform:1e-5:1e-4") == ParamSpec("train.lr", "loguniform", 1e-5, 1e-4,
                                                                    text="train.lr=loguniform:1e-5:1e-4")
    assert parse_param("objective.tau=uniform:0.1:0.5").kind == "uniform"
    assert parse_param("train.batch_size=int:8:32").values_to_check() == [8, 32]
    c = parse_param("objective.tau=choice:0.1, 0.3,0.5")
    assert c.choices == ("0.1", "0.3", "0.5") and c.values_to_check() == [0.1, 0.3, 0.5]


@pytest.mark.parametrize("spec, msg", [
    ("train.lr", "write KEY=SPEC"),
    ("train.lr=normal:0:1", "unknown kind `normal`"),
    ("train.lr=loguniform:1e-4", "two numbers"),
    ("train.lr=loguniform:0:1e-4", "LOW > 0"),
    ("train.lr=uniform:0.5:0.1", "LOW must be below HIGH"),
    ("train.batch_size=int:8.5:32", "two integers"),
    ("objective.tau=choice:0.1", "at least two"),
    ("objective.tau=choice:0.1,0.1", "twice"),
    ("train.seed=int:1:5", "set by --seeds"),
    ("output.name=choice:a,b", "not a hyper-parameter"),
])
def test_bad_specs_are_one_line_errors(spec, msg):
    with pytest.raises(RecipeError, match=msg) as e:
        parse_param(spec)
    assert "\n" not in str(e.value) and str(e.value).startswith(f"--param {spec}")


def test_override_round_trips_through_the_recipe():
    for v in (1e-5, 3.2e-05, 0.3, 2.0, 123456789.0):
        assert load_recipe(None, [override("train.lr", v)]).train.lr == v
    assert override("train.batch_size", 16) == "train.batch_size=16"


def test_bad_params_rejected_by_the_cli_before_training(tiny_recipe, tmp_path):
    cases = [
        (["--param", "train.lrr=loguniform:1e-5:1e-4"], "unknown key `train.lrr`"),
        (["--param", "train.lr=uniform:-1:1"], "must be > 0"),
        (["--param", "objective.tauu=choice:0.1,0.3"], "tauu"),
        (["--param", "train.lr=bogus"], "unknown kind"),
        (["--param", "train.lr=uniform:1e-5:1e-4", "--param", "train.lr=uniform:1e-5:1e-3"], "given twice"),
        (["--param", "train.lr=uniform:1e-5:1e-4", "--metric", "spearman"], "--metric spearman: training of this recipe evaluates accuracy, f1_macro, mcc, f1, precision, recall, roc_auc, pr_auc"),
        ([], "at least one --param"),
    ]
    for args, msg in cases:
        res = runner.invoke(app, ["sweep", "-r", "quickstart", *tiny_recipe("objective.name=scl"),
                                  "--out", str(tmp_path / "sw"), *args])
        assert res.exit_code == 2, (args, res.output)
        err = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
        assert len(err) == 1 and msg in err[0], (args, res.stderr)
        assert not (tmp_path / "sw" / "trials").exists()


class _Interrupt:
    """Trainer callback: Ctrl-C at a given step of the n-th training (counted over the process)."""

    def __init__(self, nth_training: int, step: int):
        self.nth, self.step, self.seen = nth_training, step, 0

    def __call__(self, trainer, state):
        if state.step == 1:
            self.seen += 1
        if self.seen == self.nth and state.step == self.step:
            raise KeyboardInterrupt


def test_sweep_runs_resumes_and_writes_a_best_recipe(tiny_recipe, tmp_path, monkeypatch):
    import finetune_cli.pipelines.sweep as sweep_mod

    trainings: list[str] = []
    real_run_seeds = sweep_mod.run_seeds
    stopper = _Interrupt(nth_training=4, step=2)  # trial 1, its second seed (seed 2)

    def counting_run_seeds(recipe, seeds, ui, **kw):
        outs = real_run_seeds(recipe, seeds, ui, **{**kw, "callbacks": [*kw.get("callbacks", []), stopper]})
        trainings.extend(str(o.run_dir) for o in outs if not o.already_complete)
        return outs

    monkeypatch.setattr(sweep_mod, "run_seeds", counting_run_seeds)
    sw = tmp_path / "sw"
    args = ["sweep", "-r", "quickstart", *tiny_recipe("objective.name=scl", "train.max_steps=4", "train.eval_every=2"),
            "--param", "objective.tau=choice:0.1,0.5", "--param", "train.lr=loguniform:1e-4:1e-2",
            "--trials", "3", "--seeds", "1,2", "--out", str(sw), "--no-prune", "--json"]
    res = runner.invoke(app, args)
    assert res.exit_code == 130, res.output  # interrupted during trial 1
    assert trainings == [str(sw / "trials" / "trial-000" / f"seed-{s}") for s in (1, 2)] + [
        str(sw / "trials" / "trial-001" / "seed-1")]
    assert (sw / "study.db").is_file()
    t0_summary = (sw / "trials" / "trial-000" / "seed-1" / "summary.json").stat().st_mtime_ns

    trainings.clear()
    stopper.nth = -1  # no more interruptions
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    # trial 0 was not retrained; trial 1's parameters were retried in its folder (seed 1 skipped,
    # seed 2 resumed from its checkpoint at step 2), then one new trial
    assert (sw / "trials" / "trial-000" / "seed-1" / "summary.json").stat().st_mtime_ns == t0_summary
    assert trainings[0] == str(sw / "trials" / "trial-001" / "seed-2")
    assert all("trial-000" not in t for t in trainings)
    states = [(t["number"], t["state"]) for t in out["trials"]]
    assert states == [(0, "COMPLETE"), (1, "FAIL"), (2, "COMPLETE"), (3, "COMPLETE")]
    retried = out["trials"][2]
    assert retried["run_dir"] == str(sw / "trials" / "trial-001") and retried["params"] == out["trials"][1]["params"]
    assert len([t for t in out["trials"] if t["state"] == "COMPLETE"]) == 3
    # value = mean over seeds of the per-seed metric that `finetune report` reads
    for t in out["trials"]:
        if t["state"] == "COMPLETE":
            assert set(t["values"]) == {"1", "2"}
            assert t["mean"] == pytest.approx(sum(t["values"].values()) / 2)
            for seed, v in t["values"].items():
                best = json.loads((sw / "trials" / t["run_dir"].split("/")[-1] / f"seed-{seed}" / "best" /
                                   "eval_metrics.json").read_text())
                assert best["accuracy"] == pytest.approx(v)
    best = out["best"]
    assert best["mean"] == max(t["mean"] for t in out["trials"] if t["state"] == "COMPLETE")
    # paired comparison with the recipe's own values, trained over the same seeds
    assert out["baseline"]["run_dir"] == str(sw / "baseline") and set(out["baseline"]["values"]) == {"1", "2"}
    c = out["comparison"]
    assert c["n"] == 2 and c["diff"] == pytest.approx(best["mean"] - out["baseline"]["mean"])
    # the best recipe validates and carries the best trial's values
    r = load_recipe(out["best_recipe"])
    assert r.objective.params["tau"] == best["params"]["objective.tau"]
    assert r.train.lr == best["params"]["train.lr"] and r.train.metric == "accuracy"
    assert r.run_dir.name == "tiny-best"
    assert yaml.safe_load((sw / "best.yaml").read_text())["objective"]["name"] == "scl"

    # a third run with the same command trains nothing; a different sweep in the folder is refused
    trainings.clear()
    res = runner.invoke(app, args)
    assert res.exit_code == 0 and trainings == []
    res = runner.invoke(app, [a.replace("choice:0.1,0.5", "choice:0.1,0.7") for a in args])
    assert res.exit_code == 2 and "holds a different sweep (params[" in res.stderr
    assert "choice:0.1,0.5' there, " in res.stderr and "choice:0.1,0.7' now)" in res.stderr


def test_sweep_human_table_and_pruning_callback(tiny_recipe, tmp_path):
    from finetune_cli.pipelines.sweep import PruneCallback

    class FakeTrial:
        def __init__(self, prune_at):
            self.reports, self.prune_at = [], prune_at

        def report(self, v, step):
            self.reports.append((step, v))

        def should_prune(self):
            return len(self.reports) >= self.prune_at

    class St:
        step, last_eval = 0, {}

    class Tr:
        total_steps = 10

    import optuna

    trial = FakeTrial(prune_at=2)
    cb = PruneCallback(trial, "accuracy", seed_index=1)
    st = St()
    st.step, st.last_eval = 3, {"accuracy": 0.5}
    cb(Tr(), st)
    cb(Tr(), st)  # same evaluation: not reported twice
    st.step = 4
    cb(Tr(), st)
    st.step, st.last_eval = 5, {"accuracy": 0.6}
    with pytest.raises(optuna.TrialPruned):
        cb(Tr(), st)
    assert trial.reports == [(13, 0.5), (15, 0.6)]  # seed index 1 -> offset by the 10 steps of seed 0

    res = runner.invoke(app, ["sweep", "-r", "quickstart", *tiny_recipe("train.max_steps=2"),
                              "--param", "train.lr=choice:1e-3,2e-3", "--trials", "1", "--seeds", "1",
                              "--out", str(tmp_path / "sw2"), "--no-baseline"])
    assert res.exit_code == 0, res.output
    assert "train.lr" in res.stderr and "best recipe:" in res.stderr and "complete" in res.stderr
