"""``model.head_normalize``: the pooled head reads the L2-normalised pooled embedding
(mean pooling -> normalise -> dropout -> linear), the geometry SCL's term shapes and SetFit's head reads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from finetune_cli.engine.head_refit import fit_logistic, linear_inputs, refit_target
from finetune_cli.errors import RecipeError
from finetune_cli.models.loading import load_text_model, save_text_model
from finetune_cli.models.text_model import HeadSpec
from finetune_cli.pipelines.recipes import load_recipe
from finetune_cli.pipelines.train import run_train
from finetune_cli.ui import UI

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


def test_a_run_with_refit_saves_the_fit_on_unit_vectors(tiny_recipe):
    """With refit_head the last evaluation (the last step) installs the logistic regression; with
    head_normalize its inputs are the normalised embeddings of the saved encoder."""
    from finetune_cli.data.encode import encode_table
    from finetune_cli.engine.inference import forward_all
    from finetune_cli.pipelines.common import load_data, objective_class

    recipe = load_recipe(None, tiny_recipe("model.head=pooled", "model.head_normalize=true", "model.pooling=mean",
                                           "train.max_steps=6", "train.min_evals=2", "train.refit_head=true"))
    out = run_train(recipe, UI(quiet=True), device="cpu")
    model, tok, _ = load_text_model(str(out.run_dir / "final"))
    assert model.spec.normalize
    assert "L2-normalise" in (out.run_dir / "final" / "README.md").read_text()  # the model card says so
    data = load_data(recipe, objective_class(recipe), None, need_train=True)
    enc = encode_table(data.train, tok, recipe.model.max_length, ("text",), joint=True)
    x = forward_all(model, enc, 16, tok.pad_token_id, want=("embeddings",))["embeddings"].astype(np.float64)
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    w, b = fit_logistic(unit, np.asarray(enc.labels), 2)
    lin = model.classifier.out_proj
    head_w, head_b = lin.weight.detach().double().numpy(), lin.bias.detach().double().numpy()
    np.testing.assert_allclose(head_w, w, rtol=1e-3, atol=1e-3 * np.abs(w).max())
    np.testing.assert_allclose(head_b, b, rtol=1e-3, atol=1e-3 * np.abs(b).max() + 1e-6)
    # and it is not the fit on the raw embeddings (the two differ by more than the tolerance)
    w_raw, _ = fit_logistic(x, np.asarray(enc.labels), 2)
    assert np.abs(w_raw - w).max() > 0.05 * np.abs(w).max()
