"""``objective.class_weights`` of ``ce``: balanced (scikit-learn's formula) or a list, against torch's
``F.cross_entropy(weight=...)``, and through the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.utils.class_weight import compute_class_weight

from finetune_cli.objectives.ce import CrossEntropy, balanced_weights
from tests.unit._cli import invoke, one_error_line


class _Out:
    def __init__(self, logits):
        self.logits = logits


def test_balanced_is_sklearns_formula():
    y = np.array([0, 0, 0, 0, 1, 2, 2, 0, 1, 0])
    assert balanced_weights(y, 3) == pytest.approx(compute_class_weight("balanced", classes=np.arange(3), y=y).tolist())


@pytest.mark.parametrize("weights", ["balanced", [0.5, 2.0, 1.0]])
def test_weighted_loss_is_torchs(weights):
    torch.manual_seed(0)
    logits = torch.randn(12, 3, requires_grad=True)
    y = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1, 2, 0, 1, 0])
    obj = CrossEntropy(label_smoothing=0.1, class_weights=weights)
    obj.bind_labels(y.numpy(), 3)
    w = torch.tensor(balanced_weights(y.numpy(), 3) if weights == "balanced" else weights)
    loss = obj(lambda feats: _Out(logits), {"features": [None], "labels": y})["loss"]
    ref = F.cross_entropy(logits, y, weight=w, label_smoothing=0.1)
    torch.testing.assert_close(loss, ref)
    # and by hand, without smoothing: sum_i w_{y_i} l_i / sum_i w_{y_i}
    obj0 = CrossEntropy(class_weights=weights)
    obj0.bind_labels(y.numpy(), 3)
    per = F.cross_entropy(logits, y, reduction="none")
    hand = (w[y] * per).sum() / w[y].sum()
    torch.testing.assert_close(obj0(lambda feats: _Out(logits), {"features": [None], "labels": y})["loss"], hand)
    assert not torch.allclose(hand, per.mean())


def test_cli_trains_with_balanced_weights_and_refuses_a_wrong_length(tiny_recipe):
    res = invoke("train", "-r", "quickstart", *tiny_recipe("objective.class_weights=balanced", "train.max_steps=2"),
                 "--device", "cpu", "-q", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["steps"] == 2
    res = invoke("train", "-r", "quickstart", *tiny_recipe("objective.class_weights=[1, 2, 3]"), "--overwrite")
    assert res.exit_code != 0
    assert "objective.class_weights has 3 weights but the data has 2 labels" in one_error_line(res)
    res = invoke("train", "-r", "quickstart", *tiny_recipe("objective.class_weights=balancd"), "--overwrite")
    assert res.exit_code != 0 and "class_weights must be `balanced`" in one_error_line(res)
