"""SimCSE across 2 CPU processes (gloo): gathering with gradients gives the loss and gradients of
one process on the concatenated batch."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from finetune_cli.objectives.simcse import SimCSESup, SimCSEUnsup

N, D, W = 3, 5, 2


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


def _worker(rank: int, port: int, kind: str, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=W)
    try:
        model, views = _run(kind)
        local = [{k: v[rank * N:(rank + 1) * N] for k, v in f.items()} for f in views]
        loss = _objective(kind)(model, {"features": local})["loss"]
        loss.backward()
        q.put((rank, loss.item(), model.table.grad.numpy().tolist()))  # plain data: the sender exits
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.distributed
@pytest.mark.parametrize("kind", ["unsup", "sup"])
def test_two_processes_equal_one_process_on_concatenated_batch(kind):
    model, views = _run(kind)
    ref_loss = _objective(kind)(model, {"features": views})["loss"]
    ref_loss.backward()
    ref_grad = model.table.grad

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, kind, q)) for r in range(W)]
    for p in procs:
        p.start()
    res = sorted(q.get(timeout=60) for _ in range(W))
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    # every process computes the same global loss ...
    for _, loss, _ in res:
        assert loss == pytest.approx(ref_loss.item(), rel=1e-10)
    # ... and DDP's average of the per-process gradients is the one-process gradient
    avg = sum(torch.tensor(g, dtype=torch.float64) for _, _, g in res) / W
    assert torch.allclose(avg, ref_grad, atol=1e-10)
