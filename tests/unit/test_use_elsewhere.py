"""Models that leave the tool (issue 12): classifiers are native transformers models, problem types
(regression, multi-label), `finetune predict`, model cards, and `finetune embed` = sentence-transformers."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

from finetune_cli.cli.main import app
from finetune_cli.metrics.names import metric_names
from finetune_cli.pipelines.recipes import load_plan, load_recipe
from finetune_cli.pipelines.train import run_train
from finetune_cli.ui import UI

runner = CliRunner()
CLASSIFICATION = ["ce", "scl", "core_tuning", "r3f", "r4f", "focal", "dice"]


@pytest.fixture(scope="session")
def tiny_roberta_dir(tmp_path_factory) -> Path:
    """A 2-layer, 32-wide random RoBERTa (its head: dense → tanh → dropout → out_proj), with the
    embedded model's WordPiece tokenizer (pad id 0, hence pad_token_id=0)."""
    from transformers import AutoTokenizer, RobertaConfig, RobertaModel

    from finetune_cli.models.loading import embedded_model_path

    out = tmp_path_factory.mktemp("tiny-roberta")
    torch.manual_seed(0)
    cfg = RobertaConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=130, pad_token_id=0, type_vocab_size=2)
    RobertaModel(cfg).save_pretrained(out)
    AutoTokenizer.from_pretrained(embedded_model_path()).save_pretrained(out)
    return out


def _tool_logits(folder, texts):
    from finetune_cli.models.loading import load_text_model

    model, tok, _ = load_text_model(str(folder))
    model.eval()
    with torch.no_grad():
        return model(dict(tok(texts, padding=True, return_tensors="pt"))).logits


def _hf_logits(folder, texts):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    hf = AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()  # no trust_remote_code
    tok = AutoTokenizer.from_pretrained(str(folder))
    with torch.no_grad():
        return hf(**tok(texts, padding=True, return_tensors="pt")).logits


def _one(res):
    """The pipeline's answer for one input (a list of label dicts, possibly wrapped in a list)."""
    return res[0] if res and isinstance(res[0], list) else res


TEXTS = ["a gripping , funny film", "dull and far too long", "it is fine , i guess , but the ending drags on"]


@pytest.mark.parametrize("arch", ["bert", "roberta"])
@pytest.mark.parametrize("objective", CLASSIFICATION)
def test_every_classification_objective_saves_a_native_classifier(objective, arch, tiny_recipe, tiny_model_dir,
                                                                  tiny_roberta_dir):
    from transformers import pipeline

    base = tiny_model_dir if arch == "bert" else tiny_roberta_dir
    out = run_train(load_plan(None, tiny_recipe(f"model.name={base}", f"objective.name={objective}",
                                                  "train.max_steps=2", "train.eval_every=2", "train.save_every=2")),
                    UI(quiet=True), device="cpu")
    run = out.run_dir
    want = "BertForSequenceClassification" if arch == "bert" else "RobertaForSequenceClassification"
    for folder in (run / "best", run / "final", run / "checkpoint-2" / "model"):
        cfg = json.loads((folder / "config.json").read_text())
        assert cfg["architectures"] == [want] and cfg["problem_type"] == "single_label_classification"
        tool, hf = _tool_logits(folder, TEXTS), _hf_logits(folder, TEXTS)
        assert (tool - hf).abs().max().item() <= 1e-4
        clf = pipeline("text-classification", model=str(folder), top_k=None)
        got = {d["label"]: d["score"] for d in _one(clf(TEXTS[0]))}
        p = torch.softmax(tool[0], -1)
        assert got == pytest.approx({"negative": p[0].item(), "positive": p[1].item()}, abs=1e-5)
    # the model the trainer evaluated is the model that was saved: its accuracy from transformers
    best = json.loads((run / "best" / "eval_metrics.json").read_text())
    rows = list(csv.DictReader(open(tiny_recipe()[3].split("=", 1)[1]), delimiter="\t"))
    logits = _hf_logits(run / "best", [r["sentence"] for r in rows])
    gold = [["negative", "positive"].index(r["label"]) for r in rows]
    assert (logits.argmax(-1).numpy() == np.array(gold)).mean() == pytest.approx(best["accuracy"])


def test_r4f_head_is_saved_folded_and_equals_the_evaluated_function(tiny_model_dir, tmp_path):
    """After training-mode forwards (power iterations moved u, v), the eval-mode function of the
    spectrally-normalised model is what transformers computes from the saved plain weight."""
    from finetune_cli.models import HeadSpec, load_text_model, save_text_model
    from finetune_cli.models.native import final_linear

    torch.manual_seed(0)
    model, tok, _ = load_text_model(str(tiny_model_dir), HeadSpec(num_labels=3, spectral_norm=True))
    feats = dict(tok(TEXTS, padding=True, return_tensors="pt"))
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(3):
        model(feats).logits.sum().backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    with torch.no_grad():
        evaluated = model(feats).logits
    save_text_model(model, tok, tmp_path / "m", id2label={0: "a", 1: "b", 2: "c"})
    saved = json.loads((tmp_path / "m" / "config.json").read_text())
    assert saved["architectures"] == ["BertForSequenceClassification"]
    from safetensors.torch import load_file

    w = load_file(str(tmp_path / "m" / "model.safetensors"))
    assert "classifier.weight" in w and not any("parametrizations" in k for k in w)
    assert torch.allclose(w["classifier.weight"], final_linear(model.hf).weight.detach(), atol=1e-7)
    assert (_hf_logits(tmp_path / "m", TEXTS) - evaluated).abs().max().item() <= 1e-5
    assert (_tool_logits(tmp_path / "m", TEXTS) - evaluated).abs().max().item() <= 1e-5


def test_pooled_head_is_refused_by_transformers_and_documented(tiny_recipe):
    from transformers import AutoModel, AutoModelForSequenceClassification, pipeline

    out = run_train(load_plan(None, tiny_recipe("model.head=pooled", "train.max_steps=2", "train.eval_every=2")),
                    UI(quiet=True), device="cpu")
    folder = out.run_dir / "best"
    for load in (AutoModelForSequenceClassification.from_pretrained, AutoModel.from_pretrained,
                 lambda p: pipeline("text-classification", model=p)):
        with pytest.raises(ValueError, match="finetune-pooled-classifier"):
            load(str(folder))
    card = (folder / "README.md").read_text()
    assert "transformers refuses to load it" in card and "load_text_model" in card and "SentenceTransformer" in card
    assert _tool_logits(folder, TEXTS).shape == (3, 2)


def test_model_card_front_matter_and_body(tiny_recipe):
    out = run_train(load_plan(None, tiny_recipe("objective.name=scl", "train.max_steps=2", "train.eval_every=2")),
                    UI(quiet=True), device="cpu")
    text = (out.run_dir / "best" / "README.md").read_text()
    front = yaml.safe_load(text.split("---")[1])
    assert front["library_name"] == "transformers" and front["pipeline_tag"] == "text-classification"
    assert "base_model" not in front and "a local model folder named `tiny-bert" in text  # a path is no hub id
    assert "scl" in front["tags"]
    assert front["metrics"] == list(metric_names("class"))
    assert "Gunel" in text and "| `tau` | 0.3 |" in text and "| `lam` | 0.9 |" in text  # objective + paper
    assert "training examples: 64" in text and "| `batch_size` | 8 |" in text
    acc = json.loads((out.run_dir / "best" / "eval_metrics.json").read_text())["accuracy"]
    assert f"| accuracy | {acc:.4f} |" in text
    assert "pipeline(\"text-classification\", model='tiny-best')" in text  # the folder's name, no local path
    assert str(out.run_dir) not in text
    assert ".tmp" not in text  # the folder's final path, not atomic_dir's temporary one


def _regression_files(tmp_path):
    rows = [("a cat sat on the mat", "a cat is on the mat", 4.5), ("dogs bark", "it rains today", 0.5),
            ("i like tea", "i enjoy tea", 4.0), ("the sky is blue", "cars are fast", 0.2),
            ("he runs fast", "he is running quickly", 3.8), ("red apple", "green car", 1.0)] * 4
    for name in ("train", "dev"):
        (tmp_path / f"{name}.tsv").write_text("s1\ts2\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in rows))
    return tmp_path / "train.tsv", tmp_path / "dev.tsv"


def test_regression_end_to_end(tmp_path, tiny_model_dir):
    from transformers import pipeline

    train, dev = _regression_files(tmp_path)
    base = [f"model.name={tiny_model_dir}", "model.max_length=32", "model.problem_type=regression",
            f"data.train={train}", f"data.eval={dev}", "data.columns.text=s1", "data.columns.text_pair=s2",
            "data.columns.label=score", "train.batch_size=8", "train.max_steps=4", "train.eval_every=2",
            "train.lr=1e-3", f"output.dir={tmp_path / 'runs'}", "output.name=reg"]
    out = run_train(load_plan(None, base), UI(quiet=True), device="cpu")
    assert out.summary["metric"] == "pearson" and set(out.summary["final_eval"]) == {"pearson", "spearman"}
    cfg = json.loads((out.run_dir / "best" / "config.json").read_text())
    assert cfg["problem_type"] == "regression" and cfg["num_labels"] == 1 if "num_labels" in cfg else True
    tool = _tool_logits(out.run_dir / "best", TEXTS)
    assert tool.shape == (3, 1)
    got = pipeline("text-classification", model=str(out.run_dir / "best"))(TEXTS[0])[0]["score"]
    assert got == pytest.approx(tool[0, 0].item(), abs=1e-5)  # problem_type regression: no activation
    res = runner.invoke(app, ["predict", str(out.run_dir), "-i", str(dev), "-o", str(tmp_path / "p.jsonl"),
                              "-c", "s1", "--pair-column", "s2", "--json", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert len(rows) == 24 and set(rows[0]) == {"s1", "s2", "score", "pred_score"}
    res = runner.invoke(app, ["eval", str(out.run_dir), "--json", "--device", "cpu", "--no-figures"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["metrics"]["pearson"] == pytest.approx(out.summary["final_eval"]["pearson"], abs=1e-5)
    with pytest.raises(Exception, match="objective `scl` trains single_label_classification only"):
        load_recipe(None, [*base, "objective.name=scl"])


@pytest.mark.parametrize("form", ["separator", "list"])
def test_multi_label_end_to_end(tmp_path, tiny_model_dir, form):
    from transformers import pipeline

    sets = [["pos"], ["pos", "funny"], ["neg"], ["neg", "funny"], ["funny"], []] * 4
    texts = [f"review number {i} says {' and '.join(s) or 'nothing'}" for i, s in enumerate(sets)]
    if form == "separator":
        f = tmp_path / "d.csv"
        with f.open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["text", "label"])
            w.writerows([(t, ",".join(s)) for t, s in zip(texts, sets, strict=True)])
        extra = ["data.label_separator=','"]  # problem_type auto -> multi-label
    else:
        f = tmp_path / "d.jsonl"
        f.write_text("".join(json.dumps({"text": t, "label": s}) + "\n" for t, s in zip(texts, sets, strict=True)))
        extra = ["model.problem_type=multi_label_classification"]
    base = [f"model.name={tiny_model_dir}", "model.max_length=32", f"data.train={f}", f"data.eval={f}",
            "train.batch_size=8", "train.max_steps=4", "train.eval_every=2", "train.lr=1e-3",
            f"output.dir={tmp_path / 'runs'}", "output.name=ml", *extra]
    out = run_train(load_plan(None, base), UI(quiet=True), device="cpu")
    assert out.summary["labels"] == ["funny", "neg", "pos"] and out.summary["metric"] == "f1_micro"
    assert set(out.summary["final_eval"]) == {"f1_micro", "f1_macro", "subset_accuracy"}
    cfg = json.loads((out.run_dir / "best" / "config.json").read_text())
    assert cfg["problem_type"] == "multi_label_classification"
    tool = _tool_logits(out.run_dir / "best", TEXTS)
    got = {d["label"]: d["score"] for d in _one(pipeline("text-classification", model=str(out.run_dir / "best"),
                                                           top_k=None)(TEXTS[0]))}
    assert got == pytest.approx(dict(zip(["funny", "neg", "pos"], torch.sigmoid(tool[0]).tolist(), strict=True)), abs=1e-5)
    res = runner.invoke(app, ["predict", str(out.run_dir), "-i", str(f), "-o", str(tmp_path / "p.jsonl"), "--json",
                              "--device", "cpu"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert set(rows[0]) == {"text", "label", "pred_labels", "prob_funny", "prob_neg", "prob_pos"}
    tuned = json.loads((out.run_dir / "best" / "finetune_model.json").read_text())["thresholds"]  # test_thresholds.py
    for r in rows:
        assert r["pred_labels"] == [k for k, t in zip(("funny", "neg", "pos"), tuned, strict=True) if r[f"prob_{k}"] >= t]


def test_several_labels_without_multi_label_config_is_one_line_error(tmp_path, tiny_model_dir):
    f = tmp_path / "d.csv"
    f.write_text('text,label\ngood,pos\n"good and funny","pos,funny"\nbad,neg\n')
    res = runner.invoke(app, ["train", "-r", "ce", f"model.name={tiny_model_dir}", f"data.train={f}",
                              f"data.eval={f}", "~data.dataset", f"output.dir={tmp_path}", "--device", "cpu"])
    assert res.exit_code != 0
    line = [ln for ln in res.output.splitlines() if "pos,funny" in ln]
    assert len(line) == 1 and "row 3" in line[0] and "model.problem_type=multi_label_classification" in line[0]
    assert "Traceback" not in res.output


@pytest.mark.parametrize("ext", ["csv", "tsv", "jsonl", "parquet"])
def test_predict_rows_columns_probabilities(tmp_path, tiny_recipe, quickstart_data, ext):
    out = run_train(load_plan(None, tiny_recipe("train.max_steps=2", "train.eval_every=2")), UI(quiet=True),
                    device="cpu")
    rows = list(csv.DictReader(open(quickstart_data["eval"]), delimiter="\t"))[:20]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": i, **r}) + "\n" for i, r in enumerate(rows)))
    dst = tmp_path / f"out.{ext}"
    res = runner.invoke(app, ["predict", str(out.run_dir), "--input", str(src), "--output", str(dst),
                              "--column", "sentence", "--json", "--device", "cpu", "--batch-size", "3"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["rows"] == 20 and sum(summary["predicted"].values()) == 20
    from finetune_cli.data.sources import open_table

    tf = open_table(str(dst), header="yes")
    got = tf.read({n: n for n in tf.names}).columns
    assert list(got) == ["id", "sentence", "label", "pred_label", "prob_negative", "prob_positive"]
    assert [str(x) for x in got["sentence"]] == [r["sentence"] for r in rows]  # input order kept
    p = np.array([[float(a), float(b)] for a, b in zip(got["prob_negative"], got["prob_positive"], strict=True)])
    assert np.allclose(p.sum(1), 1.0, atol=1e-6)
    ref = torch.softmax(_tool_logits(out.run_dir / "best", [r["sentence"] for r in rows]), -1).numpy()
    assert np.allclose(p, ref, atol=1e-5)
    assert got["pred_label"] == [["negative", "positive"][i] for i in ref.argmax(1)]


def test_predict_and_eval_accept_a_classifier_trained_elsewhere(tmp_path, tiny_model_dir, quickstart_data):
    """A plain transformers BertForSequenceClassification (no finetune files) with its own id2label."""
    from transformers import AutoTokenizer, BertForSequenceClassification

    torch.manual_seed(1)
    m = BertForSequenceClassification.from_pretrained(str(tiny_model_dir), num_labels=2,
                                                      id2label={0: "negative", 1: "positive"})
    m.save_pretrained(tmp_path / "foreign")
    AutoTokenizer.from_pretrained(str(tiny_model_dir)).save_pretrained(tmp_path / "foreign")
    res = runner.invoke(app, ["predict", str(tmp_path / "foreign"), "-i", quickstart_data["eval"], "-o",
                              str(tmp_path / "p.csv"), "-c", "sentence", "--json", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    got = list(csv.DictReader((tmp_path / "p.csv").open()))
    texts = [r["sentence"] for r in got]
    ref = _hf_logits(tmp_path / "foreign", texts[:4])
    assert [r["pred_label"] for r in got[:4]] == [["negative", "positive"][i] for i in ref.argmax(-1)]
    res = runner.invoke(app, ["eval", str(tmp_path / "foreign"), f"data.eval={quickstart_data['eval']}",
                              "data.columns.text=sentence", "--json", "--no-figures", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    acc = np.mean([r["pred_label"] == r["label"] for r in got])
    assert json.loads(res.stdout)["metrics"]["accuracy"] == pytest.approx(acc)


def test_predict_on_an_embedding_model_points_at_embed(tmp_path):
    f = tmp_path / "in.csv"
    f.write_text("text\nhello\n")
    res = runner.invoke(app, ["predict", "embedded", "-i", str(f), "-o", str(tmp_path / "o.csv")])
    assert res.exit_code != 0
    assert "embedding model" in res.output and "finetune embed" in res.output and "Traceback" not in res.output


SENTS = ["a short one", "a much longer sentence " + "that goes on and on " * 12 + "until it ends", "mid length text here"]


def _embed(model, tmp_path, *flags):
    txt = tmp_path / "s.txt"
    txt.write_text("\n".join(SENTS) + "\n")
    res = runner.invoke(app, ["embed", str(model), str(txt), "-o", str(tmp_path / "e.npy"), "--device", "cpu", *flags])
    assert res.exit_code == 0, res.output
    return np.load(tmp_path / "e.npy")


def _st_encode(folder):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu").encode(SENTS, convert_to_numpy=True)


def test_embed_equals_sentence_transformers_on_the_embedded_model(tmp_path):
    from finetune_cli.models.loading import embedded_model_path

    got = _embed("embedded", tmp_path)  # its Normalize module and max_seq_length 256 apply
    assert np.abs(got - _st_encode(embedded_model_path())).max() < 1e-5
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_embed_equals_sentence_transformers_on_a_cls_pooling_folder(tmp_path, tiny_model_dir):
    from sentence_transformers import SentenceTransformer, models

    tr = models.Transformer(str(tiny_model_dir), max_seq_length=16)
    st = SentenceTransformer(modules=[tr, models.Pooling(tr.get_embedding_dimension(), "cls")], device="cpu")
    st.save(str(tmp_path / "cls"))
    got = _embed(tmp_path / "cls", tmp_path)
    assert np.abs(got - _st_encode(tmp_path / "cls")).max() < 1e-5


def test_embed_equals_sentence_transformers_on_a_simcse_run(tmp_path, tiny_model_dir):
    txt = tmp_path / "train.txt"
    txt.write_text("\n".join(f"sentence {i} about {w} ." for i, w in enumerate(["cats", "dogs", "tea", "ice"] * 4)))
    res = runner.invoke(app, ["train", "--recipe", "simcse_unsup", f"model.name={tiny_model_dir}", f"data.train={txt}",
                              "~data.eval", "~data.eval_columns", "model.max_length=32", "train.batch_size=8",
                              "train.max_steps=2", "~train.metric", "train.eval_every=100",
                              f"output.dir={tmp_path / 'runs'}", "output.name=u", "--device", "cpu", "--quiet"])
    assert res.exit_code == 0, res.output
    folder = tmp_path / "runs" / "u" / "final"
    assert json.loads((folder / "sentence_bert_config.json").read_text())["max_seq_length"] == 32
    got = _embed(tmp_path / "runs" / "u", tmp_path)  # the long sentence is cut at 32 tokens, as ST does
    assert np.abs(got - _st_encode(folder)).max() < 1e-5
    text = (folder / "README.md").read_text()
    card = yaml.safe_load(text.split("---")[1])
    assert card["library_name"] == "sentence-transformers"
    # the card's finetune command runs as written (embed takes the file as an argument)
    cmd = re.search(r"`finetune (embed [^`]+)`", text).group(1).replace("u-final", str(folder)).split()
    (tmp_path / "sentences.txt").write_text("one sentence\nanother\n")
    res = runner.invoke(app, [a if not a.endswith((".txt", ".npy")) else str(tmp_path / a) for a in cmd] + ["--device", "cpu"])
    assert res.exit_code == 0, res.output
