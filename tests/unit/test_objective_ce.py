"""CE against a plain loop over the formula, with and without label smoothing."""

from __future__ import annotations

import math

import pytest
import torch

from finetune_cli.objectives import build
from finetune_cli.objectives.ce import cross_entropy


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


def test_gradient_and_parts_on_a_real_batch(tiny_model_dir):
    from transformers import AutoTokenizer

    from finetune_cli.models import HeadSpec, load_text_model

    model, tok, _ = load_text_model(str(tiny_model_dir), HeadSpec(num_labels=2))
    feats = dict(tok(["good", "bad movie"], padding=True, return_tensors="pt"))
    out = build("ce", {"label_smoothing": 0.1})(model, {"features": [feats], "labels": torch.tensor([1, 0])})
    assert set(out) == {"loss", "ce"}
    out["loss"].backward()
    assert model.encoder.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    assert AutoTokenizer is not None
