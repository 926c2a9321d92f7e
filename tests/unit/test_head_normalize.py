"""``model.head_normalize``: the pooled head reads the L2-normalised pooled embedding
(mean pooling -> normalise -> dropout -> linear), the geometry SCL's term shapes and SetFit's head reads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from finetune_cli.engine.head_refit import linear_inputs, refit_target
from finetune_cli.errors import RecipeError
from finetune_cli.models.loading import load_text_model, save_text_model
from finetune_cli.models.text_model import HeadSpec
from finetune_cli.pipelines.recipes import load_plan, load_recipe

TEXTS = ["a fine film", "dull and long", "yes", "an utterly joyless two hours of nothing"]


def _mean_pool_by_hand(model, batch) -> torch.Tensor:
    """Mean over the non-padding tokens, written as a loop over sentences."""
    h = model.encoder(**dict(batch)).last_hidden_state
    rows = []
    for i, mask in enumerate(batch["attention_mask"]):
        rows.append(h[i, mask.bool()].mean(0))
    return torch.stack(rows)


def test_logits_are_a_linear_map_of_the_unit_embedding(tiny_model_dir):
    model, tok, _ = load_text_model(str(tiny_model_dir), HeadSpec(num_labels=3, head="pooled", normalize=True))
    model.eval()
    batch = tok(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(dict(batch))
        e = _mean_pool_by_hand(model, batch)
        unit = e / e.pow(2).sum(1, keepdim=True).sqrt()
        lin = model.classifier.out_proj
        torch.testing.assert_close(out.logits, unit @ lin.weight.T + lin.bias)
        # the embeddings (what SCL contrasts, what `embed` writes) stay the raw mean-pooled vectors
        torch.testing.assert_close(out.embeddings, e)
        # scale invariance: the head sees only the direction
        torch.testing.assert_close(model.classify(3.7 * out.features), out.logits)
        assert (e.norm(dim=1) - 1).abs().max() > 0.1  # the check would mean nothing on unit vectors


def test_without_normalize_the_head_reads_the_raw_embedding(tiny_model_dir):
    model, tok, _ = load_text_model(str(tiny_model_dir), HeadSpec(num_labels=3, head="pooled"))
    model.eval()
    with torch.no_grad():
        out = model(dict(tok(TEXTS, padding=True, return_tensors="pt")))
        assert not torch.allclose(model.classify(3.7 * out.features), out.logits)


def test_refit_target_reads_unit_vectors(tiny_model_dir):
    model, tok, _ = load_text_model(str(tiny_model_dir), HeadSpec(num_labels=2, head="pooled", normalize=True))
    model.eval()
    with torch.no_grad():
        out = model(dict(tok(TEXTS, padding=True, return_tensors="pt")))
    model.train()
    x = linear_inputs(model, out.features)
    torch.testing.assert_close(x, torch.nn.functional.normalize(out.embeddings, dim=-1))
    torch.testing.assert_close(refit_target(model)(x), out.logits)


def test_saved_and_reloaded_the_folder_keeps_the_normalisation(tiny_model_dir, tmp_path):
    torch.manual_seed(3)
    model, tok, _ = load_text_model(str(tiny_model_dir), HeadSpec(num_labels=2, head="pooled", normalize=True))
    with torch.no_grad():
        model.classifier.out_proj.weight.normal_()
    save_text_model(model, tok, tmp_path / "m", id2label={0: "neg", 1: "pos"})
    back, _, _ = load_text_model(str(tmp_path / "m"))
    assert back.spec.normalize and back.classifier.normalize
    model.eval()
    back.eval()
    batch = dict(tok(TEXTS, padding=True, return_tensors="pt"))
    with torch.no_grad():
        torch.testing.assert_close(back(batch).logits, model(batch).logits)
    # asked for a head on raw inputs, the saved (unit-sphere) head is not reused: it would mean another map
    raw, _, _ = load_text_model(str(tmp_path / "m"), HeadSpec(num_labels=2, head="pooled", normalize=False))
    assert not torch.equal(raw.classifier.out_proj.weight, model.classifier.out_proj.weight)


def test_head_normalize_needs_the_pooled_head():
    with pytest.raises(RecipeError, match=r"model\.head_normalize.*pooled head only"):
        load_recipe("quickstart", ["model.head=native", "model.head_normalize=true"])
    assert load_recipe("quickstart", ["model.head=pooled", "model.head_normalize=true"]).model.head_normalize



def test_predict_and_eval_cli_use_the_normalised_head(tiny_recipe, quickstart_data, tmp_path):
    """The CLI on a run with the unit-sphere head: `predict`'s probabilities and `eval`'s accuracy are
    those of softmax(W · normalise(mean-pool) + b), computed here by hand from the saved folder."""
    import csv
    import json

    from typer.testing import CliRunner

    from finetune_cli.cli.main import app
    from finetune_cli.pipelines.train import run_train
    from finetune_cli.ui import UI

    out = run_train(load_plan(None, tiny_recipe("model.head=pooled", "model.head_normalize=true",
                                                  "train.max_steps=4", "train.eval_every=2")),
                    UI(quiet=True), device="cpu")
    rows = list(csv.DictReader(open(quickstart_data["eval"]), delimiter="\t"))
    model, tok, _ = load_text_model(str(out.run_dir / "best"))
    model.eval()
    names = [model.config.id2label[i] for i in sorted(model.config.id2label)]
    texts = [r["sentence"] for r in rows]
    with torch.no_grad():
        batch = tok(texts, padding=True, truncation=True, max_length=32, return_tensors="pt")
        e = _mean_pool_by_hand(model, batch)
        lin = model.classifier.out_proj
        ref = torch.softmax((e / e.norm(dim=1, keepdim=True)) @ lin.weight.T + lin.bias, dim=1).numpy()
    runner = CliRunner()
    dst = tmp_path / "p.jsonl"
    res = runner.invoke(app, ["predict", str(out.run_dir), "-i", quickstart_data["eval"], "-o", str(dst),
                              "-c", "sentence", "--json", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    got = [json.loads(x) for x in dst.read_text().splitlines()]
    probs = np.array([[g[f"prob_{n}"] for n in names] for g in got])
    np.testing.assert_allclose(probs, ref, atol=1e-5)
    res = runner.invoke(app, ["eval", str(out.run_dir), "--json", "--device", "cpu", "--no-figures"])
    assert res.exit_code == 0, res.output
    labels = np.array([names.index(r["label"]) for r in rows])
    assert json.loads(res.stdout)["metrics"]["accuracy"] == pytest.approx(float((ref.argmax(1) == labels).mean()))
