"""Sharing on the Hub and sentence-transformers fidelity, through the real CLI and the other library:
cards named by the folder (the repo id once pushed) with the Hub's metric ids, widget and pair
snippets; LoRA bases by hub id; exported folders keep their card; ``output.push_to_hub``; embedding
folders keep their base's ``Normalize``; the ONNX embedding graph's token output; CrossEncoder scores."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

from finetune_cli.cli.main import app
from tests.unit.test_hub_ready import _exec_card_snippet
from tests.unit.test_use_elsewhere import _regression_files

runner = CliRunner()
SENTS = ["a short one", "a much longer sentence that goes on for a while", "mid length text here"]


def _cli(*args, code=0):
    res = runner.invoke(app, [str(a) for a in args])
    assert res.exit_code == code, res.output
    return res


class _Hub:
    """``HfApi``'s repo creation and commit (what ``upload_folder`` calls), recorded instead of sent."""

    def __init__(self, monkeypatch):
        from huggingface_hub import HfApi

        self.repos, self.commits = [], []
        monkeypatch.setattr(HfApi, "create_repo", lambda api, repo_id, **kw: self.repos.append((repo_id, kw)))
        monkeypatch.setattr(HfApi, "create_commit", lambda api, *a, **kw: self._commit(*a, **kw))

    def _commit(self, repo_id, operations, **kw):
        files = {}
        for op in operations:
            src = op.path_or_fileobj
            files[op.path_in_repo] = src if isinstance(src, bytes) else Path(src).read_bytes()
        self.commits.append((repo_id, files, kw))
        return SimpleNamespace(commit_url=f"https://huggingface.co/{repo_id}/commit/0")


# ---- cards ---------------------------------------------------------------------------------------

def test_card_is_named_by_the_folder_and_by_the_repo_id_when_pushed(tiny_recipe, tmp_path, monkeypatch,
                                                                    quickstart_data):
    """No local path anywhere in the card; model-index uses the Hub's metric ids (f1 with its
    average, matthews_correlation); the widget shows evaluation sentences; the uploaded card says
    the repo id in its title, snippets and model-index, and its snippet loads the pushed files."""
    from huggingface_hub import ModelCard
    from huggingface_hub.repocard_data import model_index_to_eval_results

    _cli("train", "--recipe", "quickstart", *tiny_recipe("train.max_steps=2", "train.eval_every=2"), "--device", "cpu",
         "-q")
    run = tmp_path / "runs" / "tiny"
    text = (run / "best" / "README.md").read_text()
    assert str(tmp_path) not in text and "runs/tiny" not in text
    assert text.split("---\n", 2)[2].lstrip().startswith("# tiny-best\n")
    front = yaml.safe_load(text.split("---")[1])
    _, results = model_index_to_eval_results(front["model-index"])
    types = {r.metric_name: (r.metric_type, r.metric_args) for r in results}
    assert types["f1_macro"] == ("f1", {"average": "macro"}) and types["mcc"] == ("matthews_correlation", None)
    assert types["accuracy"] == ("accuracy", None)
    dev = Path(quickstart_data["eval"]).read_text().splitlines()
    assert front["widget"][0] == {"text": dev[1].split("\t")[0]}
    hub = _Hub(monkeypatch)
    _cli("push", run, "me/tiny", "--private")
    (repo, files, kw), = hub.commits
    assert repo == "me/tiny" and hub.repos == [("me/tiny", {"private": True, "exist_ok": True})]
    assert set(files) == {str(p.relative_to(run / "best")) for p in (run / "best").rglob("*") if p.is_file()}
    up = files["README.md"].decode()
    assert "# me/tiny\n" in up and "tiny-best" not in up and "model='me/tiny'" in up
    assert ModelCard(up).data.model_name == "me/tiny"
    assert files["model.safetensors"] == (run / "best" / "model.safetensors").read_bytes()
    # the uploaded snippet runs (the repo id standing for the downloaded folder) to the tool's logits
    src = tmp_path / "one.tsv"
    src.write_text("text\nA sentence.\n")
    _cli("predict", run / "best", "-i", src, "-o", tmp_path / "p.jsonl", "--device", "cpu")
    probs = json.loads((tmp_path / "p.jsonl").read_text())
    got = _exec_card_snippet(run / "best", up).softmax(-1)[0]
    assert got.tolist() == pytest.approx([v for k, v in probs.items() if k.startswith("prob_")], abs=1e-5)


def test_model_index_keeps_a_datasets_config():
    """``glue:stsb`` is dataset ``glue`` with config ``stsb`` (it was ``glue`` alone)."""
    from huggingface_hub import ModelCard

    from finetune_cli.models.card import card_data

    model = SimpleNamespace(has_classifier=True, hf=object(), spec=SimpleNamespace(problem_type="regression"))
    info = {"recipe": {"model": {"name": "embedded"}, "data": {"dataset": "glue:stsb"}}, "objective": "ce",
            "eval": {"pearson": 0.8, "spearman": 0.79}, "text_columns": ["text", "text_pair"],
            "examples": ["a", "b"]}
    data = card_data(Path("runs/stsb/best"), model, info)
    card = ModelCard(f"---\n{data.to_yaml()}\n---\n")
    r = card.data.eval_results[0]
    assert (r.dataset_type, r.dataset_config, r.dataset_split) == ("glue", "stsb", "validation")
    assert card.data.model_name == "stsb-best" and card.data.datasets == ["glue"]
    assert getattr(card.data, "widget", None) is None  # a pair classifier: the widget has no second text box


def test_pair_regression_card_snippet_passes_text_pair_and_crossencoder_gives_the_tools_scores(tmp_path,
                                                                                                 tiny_model_dir):
    from sentence_transformers import CrossEncoder

    train, dev = _regression_files(tmp_path)
    _cli("train", "--recipe", "quickstart", f"model.name={tiny_model_dir}", "model.max_length=32",
         "model.problem_type=regression", f"data.train={train}", f"data.eval={dev}", "data.columns.text=s1",
         "data.columns.text_pair=s2", "data.columns.label=score", "train.batch_size=8", "train.max_steps=3",
         "train.eval_every=3", "train.lr=1e-2", "train.metric=pearson", f"output.dir={tmp_path / 'runs'}",
         "output.name=reg", "--device", "cpu", "-q")
    best = tmp_path / "runs" / "reg" / "best"
    _cli("predict", best, "-i", dev, "-o", tmp_path / "p.jsonl", "-c", "s1", "--pair-column", "s2", "--device", "cpu")
    tool = [json.loads(x)["pred_score"] for x in (tmp_path / "p.jsonl").read_text().splitlines()]
    rows = [line.split("\t")[:2] for line in dev.read_text().splitlines()[1:]]
    ce = CrossEncoder(str(best), device="cpu")
    scores = ce.predict([tuple(r) for r in rows])
    assert np.abs(np.asarray(scores) - np.asarray(tool)).max() < 1e-5  # no sigmoid: the tool's scores
    text = (best / "README.md").read_text()
    assert '{"text": "A sentence.", "text_pair": "Another sentence."}' in text and "CrossEncoder(" in text
    # the snippet's logits are those of the pair (A, B), as finetune predicts it
    pair = tmp_path / "pair.tsv"
    pair.write_text("s1\ts2\nA sentence.\tAnother sentence.\n")
    _cli("predict", best, "-i", pair, "-o", tmp_path / "q.jsonl", "-c", "s1", "--pair-column", "s2", "--device", "cpu")
    want = json.loads((tmp_path / "q.jsonl").read_text())["pred_score"]
    assert _exec_card_snippet(best).item() == pytest.approx(want, abs=1e-5)


# ---- LoRA bases, export, push ---------------------------------------------------------------------

def test_lora_over_the_embedded_model_names_its_hub_id_and_still_loads_offline(tmp_path, quickstart_data):
    _cli("train", "--recipe", "quickstart", "model.name=embedded", "model.max_length=16", "model.lora.r=2",
         f"data.train={quickstart_data['train']}", "~data.eval", "data.columns.text=sentence",
         "data.max_train_samples=8", "train.batch_size=4", "train.max_steps=1", "~train.metric",
         f"output.dir={tmp_path / 'runs'}", "output.name=l", "--device", "cpu", "-q")
    final = tmp_path / "runs" / "l" / "final"
    cfg = json.loads((final / "adapter_config.json").read_text())
    assert cfg["base_model_name_or_path"] == "sentence-transformers/all-MiniLM-L6-v2"
    src = tmp_path / "s.txt"
    src.write_text("\n".join(SENTS) + "\n")
    _cli("predict", final, "-i", src, "-o", tmp_path / "p.jsonl", "--device", "cpu")  # offline: the shipped base
    _cli("push", final, "me/l", "--dry-run")


def test_push_refuses_an_adapter_over_a_local_base_in_one_line(tiny_recipe, tmp_path):
    _cli("train", "--recipe", "quickstart", *tiny_recipe("model.lora.r=2", "train.max_steps=1", "~data.eval",
                                                          "~train.metric"), "--device", "cpu", "-q")
    res = _cli("push", tmp_path / "runs" / "tiny", "me/tiny", "--dry-run", code=2)
    line, = res.output.strip().splitlines()
    assert "adapter_config.json" in line and "local path" in line and "--merge" in line


@pytest.mark.parametrize("fmt", ["merge", "onnx"])
def test_exported_folders_keep_their_card_and_push_accepts_them(tiny_recipe, tmp_path, fmt, monkeypatch):
    from huggingface_hub import ModelCard

    _cli("train", "--recipe", "quickstart", *tiny_recipe("model.lora.r=2", "train.max_steps=2",
                                                          "train.eval_every=2"), "--device", "cpu", "-q")
    out = tmp_path / "shared"
    flags = ["--merge"] if fmt == "merge" else ["--format", "onnx"]
    _cli("export", tmp_path / "runs" / "tiny" / "best", "-o", out, *flags)
    text = (out / "README.md").read_text()
    card = ModelCard(text)
    assert card.data.library_name == ("transformers" if fmt == "merge" else "onnx")
    assert "peft" not in (card.data.tags or []) and "LoRA adapter (peft)" not in text
    assert text.split("---\n", 2)[2].lstrip().startswith("# shared\n") and "tiny-best" not in text
    assert ("merged into the weights" if fmt == "merge" else "ONNX export") in text
    assert "## Evaluation" in text and "### Training log" in text  # the training record stays
    hub = _Hub(monkeypatch)
    _cli("push", out, "me/shared")
    files = hub.commits[0][1]
    assert "README.md" in files and ("model.safetensors" in files or "model.onnx" in files)
    if fmt == "onnx":  # the card's onnxruntime snippet runs on the folder and gives predict's logits
        code = re.findall(r"```python\n(.*?)```", text, re.S)[0].replace("'shared'", repr(str(out)))
        scope: dict = {}
        exec(compile(code, "card", "exec"), scope)  # noqa: S102 - the card's own documented snippet
        assert scope["logits"].shape == (1, 2)
    else:  # the merged card's snippet: transformers' pipeline on the folder
        assert _exec_card_snippet(out) is not None


def test_push_to_hub_at_the_end_of_a_run(tiny_recipe, tmp_path, monkeypatch):
    """Offline: one error line after training, the run complete and kept; with the upload recorded:
    best/ goes up to the repo (private with --private); a bad repo id is refused before training."""
    args = ["train", "--recipe", "quickstart", *tiny_recipe("train.max_steps=2", "train.eval_every=2",
                                                            "output.push_to_hub=me/tiny"), "--device", "cpu", "-q"]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    res = _cli(*args, code=5)
    errors = [x for x in res.output.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and "is complete and kept" in errors[0] and "finetune push" in errors[0], res.output
    run = tmp_path / "runs" / "tiny"
    assert (run / "summary.json").is_file() and (run / "best" / "model.safetensors").is_file()
    hub = _Hub(monkeypatch)
    _cli(*args, "--overwrite", "--private")
    (repo, files, _), = hub.commits
    assert repo == "me/tiny" and hub.repos[0][1]["private"] is True
    assert files["model.safetensors"] == (run / "best" / "model.safetensors").read_bytes()
    bad = [a if a != "output.push_to_hub=me/tiny" else "output.push_to_hub=tiny" for a in args]
    res = _cli(*bad[:-3], "output.name=bad", "--device", "cpu", "-q", code=2)
    assert "output.push_to_hub" in res.output and not (tmp_path / "runs" / "bad").exists()


# ---- sentence-transformers fidelity ----------------------------------------------------------------

@pytest.fixture
def st_base(tmp_path, tiny_model_dir):
    """A sentence-transformers folder ending with Normalize, like all-MiniLM-L6-v2."""
    from sentence_transformers import SentenceTransformer, models

    tr = models.Transformer(str(tiny_model_dir), max_seq_length=32)
    st = SentenceTransformer(modules=[tr, models.Pooling(tr.get_embedding_dimension(), "mean"), models.Normalize()],
                             device="cpu")
    st.save(str(tmp_path / "base"))
    return tmp_path / "base"


def _simcse(base, tmp_path):
    txt = tmp_path / "train.txt"
    txt.write_text("\n".join(f"sentence {i} about {w} ." for i, w in enumerate(["cats", "dogs", "tea", "ice"] * 4)))
    _cli("train", "--recipe", "simcse_unsup", f"model.name={base}", f"data.train={txt}", "~data.eval",
         "~data.eval_columns", "model.max_length=32", "train.batch_size=8", "train.max_steps=2", "~train.metric",
         "train.eval_every=100", "train.lr=1e-3", f"output.dir={tmp_path / 'runs'}", "output.name=u", "--device",
         "cpu", "-q")
    return tmp_path / "runs" / "u" / "final"


def _embed(model, tmp_path, name="e.npy"):
    txt = tmp_path / "s.txt"
    txt.write_text("\n".join(SENTS) + "\n")
    _cli("embed", model, "-i", txt, "-o", tmp_path / name, "--device", "cpu")
    return np.load(tmp_path / name)


def test_an_embedding_folder_keeps_its_bases_normalize(st_base, tmp_path):
    from sentence_transformers import SentenceTransformer

    final = _simcse(st_base, tmp_path)
    kinds = [m["type"].rsplit(".", 1)[-1] for m in json.loads((final / "modules.json").read_text())]
    assert kinds == ["Transformer", "Pooling", "Normalize"]
    assert json.loads((final / "config_sentence_transformers.json").read_text())["model_type"] == "SentenceTransformer"
    st = SentenceTransformer(str(final), device="cpu").encode(SENTS, convert_to_numpy=True)
    assert np.allclose(np.linalg.norm(st, axis=1), 1.0, atol=1e-5)
    assert np.abs(_embed(final, tmp_path) - st).max() < 1e-5
    base = SentenceTransformer(str(st_base), device="cpu").encode(SENTS, convert_to_numpy=True)
    assert np.abs(base - st).max() > 1e-4  # it trained: the check above is not the base's output


def test_an_onnx_embedding_folder_gives_token_states_sentence_transformers_pools(st_base, tmp_path):
    """The graph's ``last_hidden_state`` (what optimum's feature-extraction class and so
    ``SentenceTransformer(..., backend="onnx")`` read), pooled and normalised as the folder's modules
    say, is sentence-transformers' torch embedding; ``finetune embed`` on the ONNX folder agrees."""
    import onnxruntime as ort
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    final = _simcse(st_base, tmp_path)
    out = tmp_path / "onnx"
    _cli("export", final, "-o", out, "--format", "onnx")
    want = SentenceTransformer(str(final), device="cpu").encode(SENTS, convert_to_numpy=True)
    sess = ort.InferenceSession(str(out / "model.onnx"))
    assert "last_hidden_state" in [o.name for o in sess.get_outputs()]
    enc = AutoTokenizer.from_pretrained(str(out))(SENTS, padding=True, truncation=True, max_length=32,
                                                  return_tensors="np")
    tokens = sess.run(["last_hidden_state"], {i.name: enc[i.name] for i in sess.get_inputs()})[0]
    mask = enc["attention_mask"][..., None]
    pooled = (tokens * mask).sum(1) / mask.sum(1)
    assert np.abs(pooled / np.linalg.norm(pooled, axis=1, keepdims=True) - want).max() < 1e-5
    assert np.abs(_embed(out, tmp_path, "o.npy") - want).max() < 1e-5
    assert json.loads((out / "modules.json").read_text())[-1]["path"] == "2_Normalize"
    try:
        import optimum.onnxruntime  # noqa: F401
    except Exception:  # noqa: BLE001 - not installed, or a release that does not import with this transformers
        pytest.skip("optimum[onnxruntime] not importable: SentenceTransformer(backend='onnx') needs it")
    got = SentenceTransformer(str(out), backend="onnx", device="cpu").encode(SENTS, convert_to_numpy=True)
    assert np.abs(got - want).max() < 1e-5
    from optimum.onnxruntime import ORTModelForFeatureExtraction

    feats = ORTModelForFeatureExtraction.from_pretrained(str(out))(**AutoTokenizer.from_pretrained(str(out))(
        SENTS, padding=True, return_tensors="pt")).last_hidden_state
    assert torch.allclose(feats, torch.from_numpy(tokens), atol=1e-5)
