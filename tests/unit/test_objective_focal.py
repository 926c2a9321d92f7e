"""Focal loss against a plain loop over −α_t (1 − p_t)^γ log p_t; γ = 0 is exactly CE."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from finetune_cli.errors import DataError
from finetune_cli.objectives import build
from finetune_cli.objectives.focal import focal_loss
from finetune_cli.pipelines.recipes import load_recipe
from finetune_cli.recipe import RecipeError
from tests.unit._objective_batch import model_and_batch


def reference_focal(logits, labels, gamma, alpha=None):
    total = 0.0
    for z, y in zip(logits.tolist(), labels.tolist(), strict=True):
        m = max(z)
        s = sum(math.exp(v - m) for v in z)
        p_t = math.exp(z[y] - m) / s
        a_t = 1.0 if alpha is None else alpha[y]
        total += -a_t * (1 - p_t) ** gamma * math.log(p_t)
    return total / len(labels)


def _data(n=8, c=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, c, generator=g, dtype=torch.float64) * 3, torch.randint(0, c, (n,), generator=g)


@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0, 2.0, 5.0])
@pytest.mark.parametrize("alpha", [None, [0.25, 1.0, 2.0, 0.5]])
def test_matches_reference(gamma, alpha):
    logits, y = _data()
    a = torch.tensor(alpha, dtype=torch.float64) if alpha else None
    assert focal_loss(logits, y, gamma, a).item() == pytest.approx(reference_focal(logits, y, gamma, alpha), rel=1e-10)


def test_gamma_zero_without_alpha_is_cross_entropy():
    for seed in range(5):
        logits, y = _data(seed=seed)
        got, want = focal_loss(logits, y, 0.0), F.cross_entropy(logits, y)
        assert torch.allclose(got, want, rtol=0, atol=1e-7), (got, want)
    # and the same gradient
    logits, y = _data(seed=9)
    gl = logits.clone().requires_grad_()
    gc = logits.clone().requires_grad_()
    focal_loss(gl, y, 0.0).backward()
    F.cross_entropy(gc, y).backward()
    assert torch.allclose(gl.grad, gc.grad, rtol=0, atol=1e-12)


def test_gamma_zero_objective_equals_ce_objective_on_a_model(tiny_model_dir, quickstart_data):
    model, _, batch, focal = model_and_batch(tiny_model_dir, quickstart_data, "focal", "objective.gamma=0.0")
    model.eval()
    with torch.no_grad():
        a = focal(model, batch)["loss"]
        b = build("ce", {})(model, batch)["loss"]
    assert torch.allclose(a, b, rtol=0, atol=1e-7)


def test_focusing_downweights_easy_examples():
    """An easy example (p_t ≈ 0.95) loses much more of its weight than a hard one (p_t ≈ 0.2)."""
    easy = torch.tensor([[3.0, 0.0]], dtype=torch.float64)
    hard = torch.tensor([[0.0, 1.4]], dtype=torch.float64)
    y = torch.tensor([0])
    ratio_easy = focal_loss(easy, y, 2.0) / focal_loss(easy, y, 0.0)
    ratio_hard = focal_loss(hard, y, 2.0) / focal_loss(hard, y, 0.0)
    assert ratio_easy < 0.01 < 0.5 < ratio_hard


def test_scalar_alpha_is_the_papers_binary_form():
    logits, y = _data(c=2, seed=3)
    got = build("focal", {"gamma": 2.0, "alpha": 0.25}).alpha
    assert got.tolist() == [0.75, 0.25]
    assert focal_loss(logits, y, 2.0, got.double()).item() == pytest.approx(
        reference_focal(logits, y, 2.0, [0.75, 0.25]), rel=1e-10)


def test_gradcheck_and_finite_gradient_when_confident():
    logits, y = _data(5, 3, seed=4)
    x = logits.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda z: focal_loss(z, y, 1.5), (x,))
    assert torch.autograd.gradcheck(lambda z: focal_loss(z, y, 0.5), (x,))
    # p_t == 1 in float32: (1 − p_t)^γ with γ < 1 has an infinite derivative there; no NaN allowed
    sure = torch.tensor([[60.0, -60.0]], requires_grad=True)
    focal_loss(sure, torch.tensor([0]), 0.5).backward()
    assert torch.isfinite(sure.grad).all()


def test_nonzero_gradient_on_a_real_batch(tiny_model_dir, quickstart_data):
    model, _, batch, obj = model_and_batch(tiny_model_dir, quickstart_data, "focal")
    model.train()
    out = obj(model, batch)
    assert set(out) == {"loss", "focal"}
    out["loss"].backward()
    assert model.encoder.embeddings.word_embeddings.weight.grad.abs().sum() > 0


def test_alpha_of_the_wrong_length_is_a_data_error(tiny_model_dir, quickstart_data):
    model, _, batch, obj = model_and_batch(tiny_model_dir, quickstart_data, "focal", "objective.alpha=[1,1,1]")
    with pytest.raises(DataError, match="3 class weights but the data has 2 classes"):
        obj(model, batch)


@pytest.mark.parametrize("bad,msg", [("objective.gamma=-1", "gamma must be >= 0"),
                                     ("objective.alpha=1.5", "alpha must be <= 1"),
                                     ("objective.alpha=[0.5,-1]", r"alpha\[c\] must be >= 0"),
                                     ("objective.alpha=[]", "non-empty"),
                                     ("objective.alpha=high", "must be float or list")])
def test_invalid_hyperparameters_fail_at_recipe_validation(bad, msg):
    with pytest.raises(RecipeError, match=msg):
        load_recipe("focal", [bad])
