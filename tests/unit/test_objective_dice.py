"""Self-adjusting Dice loss against a plain loop over the paper's per-example formula; an example's
loss must not depend on the rest of the batch (the authors' code gets this wrong)."""

from __future__ import annotations

import math

import pytest
import torch

from finetune_cli.objectives.dice import self_adjusting_dice_loss
from finetune_cli.pipelines.recipes import load_recipe
from finetune_cli.recipe import RecipeError
from tests.unit._objective_batch import model_and_batch


def reference_dice(logits, labels, alpha, gamma):
    """(1/N) Σ_i Σ_c [1 − (2 q_ic y_ic + γ) / (q_ic + y_ic + γ)], q = (1 − p)^α p, one-vs-rest."""
    total = 0.0
    for z, y in zip(logits.tolist(), labels.tolist(), strict=True):
        m = max(z)
        s = sum(math.exp(v - m) for v in z)
        for c, v in enumerate(z):
            p = math.exp(v - m) / s
            yc = 1.0 if c == y else 0.0
            q = (1 - p) ** alpha * p
            total += 1 - (2 * q * yc + gamma) / (q + yc + gamma)
    return total / len(labels)


def authors_code_dice(logits, labels, alpha, gamma):
    """The reference repository's arithmetic: denominator summed over the whole batch."""
    p = torch.softmax(logits, -1)
    y = torch.nn.functional.one_hot(labels, logits.shape[-1]).to(p)
    q = (1 - p) ** alpha * p
    loss = 0
    for c in range(logits.shape[-1]):
        loss = loss + 1 - (2 * q[:, c] * y[:, c] + gamma) / (q[:, c].sum() + y[:, c].sum() + gamma)
    return loss.mean()


def _data(n=8, c=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, c, generator=g, dtype=torch.float64) * 2, torch.randint(0, c, (n,), generator=g)


@pytest.mark.parametrize("alpha", [0.0, 0.01, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("gamma", [1e-3, 1.0, 5.0])
@pytest.mark.parametrize("c", [2, 4])
def test_matches_reference(alpha, gamma, c):
    logits, y = _data(c=c, seed=c)
    got = self_adjusting_dice_loss(logits, y, alpha, gamma).item()
    assert got == pytest.approx(reference_dice(logits, y, alpha, gamma), rel=1e-10)


def _per_row_is_batch_independent(fn) -> bool:
    logits, y = _data(n=6, seed=1)
    alone = torch.stack([fn(logits[i:i + 1], y[i:i + 1]) for i in range(6)])
    whole = fn(logits, y)
    other_logits, other_y = _data(n=5, seed=2)
    with_others = fn(torch.cat([logits[:1], other_logits]), torch.cat([y[:1], other_y])) * 6 - fn(other_logits, other_y) * 5
    return bool(torch.allclose(whole, alone.mean(), atol=1e-12) and torch.allclose(with_others, alone[0], atol=1e-12))


def test_an_examples_loss_does_not_depend_on_the_other_rows():
    assert _per_row_is_batch_independent(lambda z, y: self_adjusting_dice_loss(z, y, 0.5, 1.0))
    # the check has teeth: the authors' batch-summed denominator fails it
    assert not _per_row_is_batch_independent(lambda z, y: authors_code_dice(z, y, 0.5, 1.0))


def test_confident_correct_prediction_costs_nothing_without_self_adjustment():
    """α = 0, γ = 1. Right and sure, p = onehot(y): gold class 1 − (2 + γ)/(1 + 1 + γ) = 0, other
    classes 1 − γ/(0 + 0 + γ) = 0. Wrong and sure: gold class 1 − γ/(0 + 1 + γ) = 1/2, the
    predicted class 1 − γ/(1 + 0 + γ) = 1/2, the third 0: 1 per example."""
    logits = torch.tensor([[40.0, -40.0, -40.0], [-40.0, -40.0, 40.0]], dtype=torch.float64)
    assert self_adjusting_dice_loss(logits, torch.tensor([0, 2]), 0.0, 1.0).item() == pytest.approx(0.0, abs=1e-12)
    assert self_adjusting_dice_loss(logits, torch.tensor([1, 0]), 0.0, 1.0).item() == pytest.approx(1.0, abs=1e-12)


def test_gradcheck():
    logits, y = _data(5, 3, seed=3)
    x = logits.clone().requires_grad_()
    for alpha in (0.0, 0.3, 1.0):
        assert torch.autograd.gradcheck(lambda z, a=alpha: self_adjusting_dice_loss(z, y, a, 1.0), (x,))


def test_nonzero_gradient_on_a_real_batch(tiny_model_dir, quickstart_data):
    model, _, batch, obj = model_and_batch(tiny_model_dir, quickstart_data, "dice")
    model.train()
    out = obj(model, batch)
    assert set(out) == {"loss", "dice"}
    out["loss"].backward()
    assert model.encoder.embeddings.word_embeddings.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("bad,msg", [("objective.alpha=-0.1", "alpha must be >= 0"),
                                     ("objective.gamma=0", "gamma must be > 0"),
                                     ("objective.smooth=1", "unknown key `objective.smooth`")])
def test_invalid_hyperparameters_fail_at_recipe_validation(bad, msg):
    with pytest.raises(RecipeError, match=msg):
        load_recipe("dice", [bad])
