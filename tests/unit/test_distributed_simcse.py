"""SimCSE across 2 CPU processes (gloo): gathering with gradients gives the loss and gradients of
one process on the concatenated batch."""

from __future__ import annotations

import pytest
import torch

from finetune_cli.objectives.simcse import SimCSESup, SimCSEUnsup
from tests.unit._gloo import WORLD as W
from tests.unit._gloo import process_group, save, spawn

N, D = 3, 5


class _FakeModel(torch.nn.Module):
    """A linear "encoder" over a per-token table: embeddings = mean of W[input_ids] (no dropout),
    so per-row results are independent of the batch they are computed in."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.table = torch.nn.Parameter(torch.randn(50, D, generator=g, dtype=torch.float64))

    def forward(self, f):
        from finetune_cli.models.text_model import ModelOutput

        m = f["attention_mask"].unsqueeze(-1).double()
        e = (self.table[f["input_ids"]] * m).sum(1) / m.sum(1)
        return ModelOutput(embeddings=e)


def _views(n_views: int):
    g = torch.Generator().manual_seed(1)
    ids = [torch.randint(1, 50, (W * N, 4), generator=g) for _ in range(n_views)]
    ids[0][1] = ids[0][4]  # a duplicate text across the two ranks: masked as a false negative
    if n_views > 1:
        ids[1][1] = ids[1][4]
    return [{"input_ids": x, "attention_mask": torch.ones_like(x)} for x in ids]


def _objective(kind: str):
    return SimCSEUnsup(tau=0.1) if kind == "unsup" else SimCSESup(tau=0.1, hard_neg_weight=0.3)


def _run(kind: str):
    views = _views(1 if kind == "unsup" else 3)
    model = _FakeModel()
    return model, views


def _worker(rank: int, store: str, out: str, kind: str):
    with process_group(rank, store):
        model, views = _run(kind)
        local = [{k: v[rank * N:(rank + 1) * N] for k, v in f.items()} for f in views]
        loss = _objective(kind)(model, {"features": local})["loss"]
        loss.backward()
        save(rank, out, {"loss": loss.detach(), "grad": model.table.grad})


@pytest.mark.distributed
@pytest.mark.parametrize("kind", ["unsup", "sup"])
def test_two_processes_equal_one_process_on_concatenated_batch(kind, tmp_path):
    model, views = _run(kind)
    ref_loss = _objective(kind)(model, {"features": views})["loss"]
    ref_loss.backward()
    ref_grad = model.table.grad

    res = spawn(_worker, tmp_path, kind)
    # every process computes the same global loss ...
    for got in res:
        assert got["loss"].item() == pytest.approx(ref_loss.item(), rel=1e-10)
    # ... and DDP's average of the per-process gradients is the one-process gradient
    avg = sum(got["grad"] for got in res) / W
    assert torch.allclose(avg, ref_grad, atol=1e-10)
