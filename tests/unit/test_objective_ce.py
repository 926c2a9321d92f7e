"""CE against a plain loop over the formula, with and without label smoothing."""

from __future__ import annotations

import math

import pytest
import torch

from finetune_cli.objectives.ce import cross_entropy
from tests.unit._objective_batch import model_and_batch, no_dropout


def reference_ce(logits, labels, eps):
    total = 0.0
    n, c = logits.shape
    for i in range(n):
        z = [float(v) for v in logits[i]]
        m = max(z)
        logsum = m + math.log(sum(math.exp(v - m) for v in z))
        for k in range(c):
            q = (1 - eps) * (1.0 if k == labels[i] else 0.0) + eps / c
            total += -q * (z[k] - logsum)
    return total / n


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.5])
def test_matches_reference(eps):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 4, generator=g, dtype=torch.float64) * 3
    labels = torch.randint(0, 4, (7,), generator=g)
    got = cross_entropy(logits, labels, eps).item()
    assert got == pytest.approx(reference_ce(logits, labels.tolist(), eps), rel=1e-6)


def test_gradient_and_parts_on_a_batch_from_the_real_sampler(tiny_model_dir, quickstart_data):
    """A batch built as `finetune train` builds it: the loss is the reference CE of the model's own
    logits, and every trained part (encoder, classifier) gets a non-zero gradient."""
    model, _, batch, obj = model_and_batch(tiny_model_dir, quickstart_data, "ce", "objective.label_smoothing=0.1")
    out = obj(no_dropout(model), batch)
    assert set(out) == {"loss", "ce"}
    logits = model(batch["features"][0]).logits.detach()
    assert out["loss"].item() == pytest.approx(reference_ce(logits.double(), batch["labels"].tolist(), 0.1), rel=1e-5)
    out["loss"].backward()
    assert model.encoder.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    head = [p for n, p in model.named_parameters() if "classifier" in n]  # native (hf.classifier) or pooled
    assert head and all(p.grad is not None and p.grad.abs().sum() > 0 for p in head)
