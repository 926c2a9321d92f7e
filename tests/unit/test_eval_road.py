"""`finetune eval` takes one road, keyed by what the model is: the plan resolved once, the data read
once and before any weight loads, the model described from its small files exactly as it loads."""

from __future__ import annotations

import json

import pytest

from tests.unit._cli import invoke
from tests.unit._cli import one_error_line as error_line


@pytest.fixture
def trained_run(tiny_recipe, tmp_path):
    res = invoke("train", "-r", "quickstart", *tiny_recipe("data.max_train_samples=32"), "--device", "cpu", "-q")
    assert res.exit_code == 0, res.output
    return tmp_path / "runs" / "tiny"


def _native_classifier(tmp_path, tiny_model_dir):
    """A folder finetune did not write: transformers' own sequence classifier with named labels."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    cfg = BertConfig.from_pretrained(tiny_model_dir, num_labels=3, id2label={0: "sad", 1: "calm", 2: "glad"},
                                     label2id={"sad": 0, "calm": 1, "glad": 2})
    out = tmp_path / "native"
    BertForSequenceClassification(cfg).save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    return out


def test_describe_model_says_what_the_loaded_model_is(trained_run, tiny_recipe, tiny_model_dir, tmp_path):
    from finetune_cli.engine.inference import open_session
    from finetune_cli.models.loading import describe_model

    res = invoke("train", "-r", "quickstart", *tiny_recipe("data.max_train_samples=16", "model.head=pooled",
                                                          "output.name=pooled"), "--device", "cpu", "-q")
    assert res.exit_code == 0, res.output
    folders = {"run directory (native head)": trained_run, "run directory (pooled head)": trained_run.with_name("pooled"),
               "bare encoder": tiny_model_dir,
               "native classifier": _native_classifier(tmp_path, tiny_model_dir), "embedded": "embedded"}
    seen = set()
    for what, name in folders.items():
        info, sess = describe_model(str(name)), open_session(str(name), device="cpu")
        assert (info.path, info.spec, info.label_names) == (sess.path, sess.model.spec, sess.label_names), what
        assert info.has_classifier == sess.model.has_classifier, what
        seen.add((info.has_classifier, info.spec.head))
    assert {(True, "pooled"), (True, "native")} <= seen and (False, "native") in seen  # the cases differ


def test_eval_reads_its_data_once(trained_run, monkeypatch):
    from finetune_cli.data import tasks

    reads = []
    real = tasks._read

    def counting(cfg, which, *a, **k):
        reads.append(which)
        return real(cfg, which, *a, **k)

    monkeypatch.setattr(tasks, "_read", counting)
    res = invoke("eval", str(trained_run), "--json", "-q", "--no-figures")
    assert res.exit_code == 0, res.output
    assert reads == ["eval"] and json.loads(res.stdout)["examples"] == 100


def test_eval_refuses_bad_data_before_any_weight_loads(trained_run, tmp_path, monkeypatch):
    from finetune_cli.engine import inference

    def no_weights(*a, **k):
        raise AssertionError("weights loaded before the data was checked")

    monkeypatch.setattr(inference, "load_text_model", no_weights)
    ev = tmp_path / "ev.tsv"
    ev.write_text("sentence\tlabel\nfine\tneutral\n")
    res = invoke("eval", str(trained_run), f"data.eval={ev}", "-q")
    assert res.exit_code == 2, res.output
    assert "label `neutral` in row 2 of" in error_line(res)


def test_eval_reads_labels_by_the_models_own_names(tiny_model_dir, tmp_path):
    """A classifier someone else trained, with its own label names: the file's names map to its
    ids whatever the recipe says (the model is what decides how labels are read)."""
    model = _native_classifier(tmp_path, tiny_model_dir)
    ev = tmp_path / "ev.tsv"
    ev.write_text("sentence\tlabel\nawful\tsad\nokay\tcalm\ngreat\tglad\nso so\tcalm\n")
    res = invoke("eval", str(model), f"data.eval={ev}", "data.columns.text=sentence", "--json", "-q",
                 "--no-figures", "--out", str(tmp_path / "out"))
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["labels"] == ["sad", "calm", "glad"] and out["examples"] == 4
    assert sum(map(sum, out["confusion_matrix"])) == 4
    assert [sum(row) for row in out["confusion_matrix"]] == [1, 2, 1]  # gold rows by the model's ids


def test_eval_of_a_model_without_a_classifier_is_by_similarity(tiny_model_dir, tmp_path):
    pairs = tmp_path / "sts.tsv"
    pairs.write_text("a\tb\tscore\nA man plays.\tA man is playing.\t4.8\nA cat.\tThe stock fell.\t0.2\n"
                     "A dog runs.\tA dog is running.\t4.5\nRain today.\tA man sings.\t0.5\n")
    common = [f"data.eval={pairs}", "data.columns.text=a", "data.columns.text_pair=b", "data.columns.label=score"]
    res = invoke("eval", str(tiny_model_dir), *common, "--json", "-q")
    assert res.exit_code == 0, res.output
    assert {"spearman", "pearson"} <= set(json.loads(res.stdout)["metrics"])
    res = invoke("eval", str(tiny_model_dir), *common, "--threshold", "0.4", "-q")
    assert res.exit_code == 2 and "is evaluated as an embedding model" in error_line(res)


def test_the_cli_calls_one_evaluation_pipeline():
    """`cli/eval.py` hands every model to one pipeline function; the choice is the pipeline's."""
    import ast
    import inspect

    from finetune_cli.cli import eval as cli_eval

    tree = ast.parse(inspect.getsource(cli_eval))
    imported = {(n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names
                if n.module and n.module.startswith("finetune_cli.pipelines")}
    assert imported == {("finetune_cli.pipelines.evaluate", "eval_plan"),
                        ("finetune_cli.pipelines.evaluate", "evaluate")}
