"""Contrastive losses across processes: two CPU (gloo) processes, each holding half of a batch,
compute the same loss and — after DDP's gradient average — the same gradients as one process
holding the whole batch.

Why the ×world: ``gather_with_grad``'s backward sums, for each process's rows, the gradients every
process computed for them. Every process computes the same global loss, so a process receives
``world ×`` the single-process gradient of its rows; DDP then averages parameter gradients over
the processes (÷ world), which gives back exactly the single-process gradient.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.unit._gloo import WORLD, process_group, save, spawn

pytestmark = pytest.mark.distributed


def _data(sizes):
    g = torch.Generator().manual_seed(0)
    n = sum(sizes)
    emb = torch.randn(n, 8, generator=g, dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 0, 1, 1, 2, 0, 3, 1][:n])  # class 3: a lone anchor
    return emb, labels


def _scl_on(emb, labels, left_out=False):
    from finetune_cli.objectives._dist import gather_no_grad, gather_with_grad
    from finetune_cli.objectives.scl import supervised_contrastive_loss

    z = F.normalize(emb, dim=-1)
    return supervised_contrastive_loss(gather_with_grad(z, left_out), gather_no_grad(labels, left_out), 0.3)


def _worker(rank, store, out, sizes):
    with process_group(rank, store):
        emb, labels = _data(sizes)
        start = sum(sizes[:rank])
        local = emb[start:start + sizes[rank]].clone().requires_grad_(True)
        loss = _scl_on(local, labels[start:start + sizes[rank]])
        loss.backward()
        save(rank, out, {"loss": loss.detach(), "grad": local.grad})


@pytest.mark.parametrize("sizes", [(4, 4), (3, 5)])  # unequal: the last batch, or packed groups
def test_two_processes_equal_one_process_on_the_concatenated_batch(tmp_path, sizes):
    results = spawn(_worker, tmp_path, sizes)
    emb, labels = _data(sizes)
    full = emb.clone().requires_grad_(True)
    ref = _scl_on(full, labels)  # not initialised here: the gathers are identities
    ref.backward()
    start = 0
    for rank in range(WORLD):
        got = results[rank]
        assert got["loss"].item() == pytest.approx(ref.item(), rel=1e-12)
        # DDP averages over WORLD processes: grad / WORLD must be the single-process gradient
        assert torch.allclose(got["grad"] / WORLD, full.grad[start:start + sizes[rank]], atol=1e-12)
        start += sizes[rank]
    assert full.grad.abs().sum() > 0


class _StubModel(torch.nn.Module):
    """Embeddings = x·W, with what core_tuning reads (classifier features, ``classify``, a projection)."""

    num_labels = 4

    def __init__(self):
        super().__init__()
        from finetune_cli.models.text_model import ClassificationHead, ModelOutput, ProjectionHead

        torch.manual_seed(0)
        self.w = torch.nn.Linear(8, 6)
        self.classifier = ClassificationHead(6, 4, 0.0)
        self.projection = ProjectionHead(6)
        self._out = ModelOutput

    def classify(self, feats):
        return self.classifier(feats)

    def forward(self, features):
        e = self.w(features["x"])
        return self._out(embeddings=e, features=e)


def _core_worker(rank, store, out, sizes, padding_rank=None):
    """Core-tuning on this rank's slice; the rank ``padding_rank`` trains on a padding batch."""
    from finetune_cli.objectives import build
    from finetune_cli.objectives._dist import LEFT_OUT

    with process_group(rank, store):
        emb, labels = _data(sizes)
        start = sum(sizes[:rank])
        sl = slice(start, start + sizes[rank])
        model = _StubModel().double()
        torch.manual_seed(100 + rank)  # processes draw different mixing weights, as in training
        batch = {"features": [{"x": emb[sl]}], "labels": labels[sl], LEFT_OUT: rank == padding_rank}
        res = build("core_tuning", {"eta": 1.0})(model, batch)
        res["loss"].backward()
        save(rank, out, {"con": res["con"], "grad": model.w.weight.grad})


def test_core_tuning_runs_on_two_processes_with_one_global_contrastive_term(tmp_path):
    """Mining, mixing and the contrastive term see the gathered batch: every process computes the
    same L_con (its mixing weights differ per process, so there is no single-process reference)."""
    sizes = (3, 5)
    got = spawn(_core_worker, tmp_path, sizes)
    assert got[0]["con"].item() == pytest.approx(got[1]["con"].item(), rel=1e-12)
    assert all(torch.isfinite(g["grad"]).all() and g["grad"].abs().sum() > 0 for g in got)


def _left_out_worker(rank, store, out, sizes):
    with process_group(rank, store):
        emb, labels = _data(sizes)
        start = sum(sizes[:rank])
        local = emb[start:start + sizes[rank]].clone().requires_grad_(True)
        loss = _scl_on(local, labels[start:start + sizes[rank]], left_out=rank == 1)  # rank 1: a padding batch
        loss.backward()
        save(rank, out, {"loss": loss.detach(), "grad": local.grad})


def test_a_padding_batch_is_left_out_of_the_gathered_batch(tmp_path):
    """A process on a padding batch (``left_out``, from ``batch[LEFT_OUT]``) adds no rows to the gather: both processes compute
    the loss of rank 0's rows alone, as one process does on them; the padding rows get no gradient
    (they are neither positives nor negatives)."""
    sizes = (5, 4)
    got = spawn(_left_out_worker, tmp_path, sizes)
    emb, labels = _data(sizes)
    own = emb[:5].clone().requires_grad_(True)
    ref = _scl_on(own, labels[:5])
    ref.backward()
    assert ref.item() != pytest.approx(_scl_on(emb, labels).item())  # the check can tell
    for g in got:
        assert g["loss"].item() == pytest.approx(ref.item(), rel=1e-12)
    assert torch.allclose(got[0]["grad"] / WORLD, own.grad, atol=1e-12)
    assert got[1]["grad"] is None or not got[1]["grad"].any()


def test_core_tuning_with_a_padding_batch_mixes_and_contrasts_the_real_rows_only(tmp_path):
    """Core-tuning mines and mixes for its own anchors at their offset in the gathered batch: a
    process left out has no anchors there (it would index past the batch), and both processes
    compute the same contrastive term over rank 0's rows and mixtures."""
    got = spawn(_core_worker, tmp_path, (3, 5), 1)
    assert torch.isfinite(got[0]["con"]) and got[0]["con"].item() == pytest.approx(got[1]["con"].item(), rel=1e-12)
