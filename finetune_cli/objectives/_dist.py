"""Gathering across processes *with* gradients, for in-batch contrastive objectives.

``torch.distributed.all_gather`` returns tensors cut off from autograd, so a loss computed on the
gathered batch would only train on the local rows' part of the similarity matrix.
``torch.distributed.nn.functional.all_gather`` is differentiable: the backward all-reduces the
gradient of each gathered block back to its owner, so every process gets the gradient it would
get if one process had computed the loss on the concatenated batch (scaled by the world size, since
each process computes the same global loss and DDP then averages the gradients).

A process training on a padding batch (``data.sampling.Padding``: repeated examples that only keep
the processes in step) still takes part in every gather, but with no rows: the trainer marks such a
batch (``batch[LEFT_OUT]``) and an objective passes :func:`is_left_out` of its batch to the gathers,
so a repeated example never acts as a positive or a negative of the others.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

# The batch key the trainer sets on a padding batch: this process adds no rows to the gathered
# batches; it still gets the others' rows, so it computes the same global loss as they do.
LEFT_OUT = "left_out"


def is_left_out(batch: Mapping[str, Any]) -> bool:
    """Whether ``batch`` is a padding batch whose rows stay out of every gather."""
    return bool(batch.get(LEFT_OUT, False))


def world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _sizes(x: torch.Tensor, size: int) -> list[int]:
    """First-dimension length of ``x`` on every process (batches may differ by a few rows: the
    last batch of an epoch, or a sampler that packs groups of examples)."""
    n = torch.tensor([x.shape[0]], device=x.device, dtype=torch.long)
    out = [torch.empty_like(n) for _ in range(size)]
    dist.all_gather(out, n)
    return [int(t.item()) for t in out]


def _pad(x: torch.Tensor, rows: int) -> torch.Tensor:
    if x.shape[0] == rows:
        return x.contiguous()
    pad = x.new_zeros((rows - x.shape[0], *x.shape[1:]))
    return torch.cat([x, pad], dim=0)


def gather_with_grad(x: torch.Tensor, left_out: bool = False) -> torch.Tensor:
    """Concatenate ``x`` from every process along dim 0 (rank order), keeping gradients.

    Single process: returns ``x`` unchanged. Processes may pass different first-dimension
    lengths (rows are padded for the collective and cut off again, so padding never reaches the
    loss). The backward sums, for each process's rows, the gradients every process computed for
    them; when every process computes the same global loss that is ``world`` times the
    single-process gradient, which DDP's gradient average divides out again. ``left_out``: this
    process adds no rows (a padding batch).
    """
    rank, size = world()
    if size == 1:
        return x
    from torch.distributed.nn.functional import all_gather

    x = x[:0] if left_out else x
    sizes = _sizes(x, size)
    parts = all_gather(_pad(x, max(sizes)))
    return torch.cat([p[:n] for p, n in zip(parts, sizes, strict=True)], dim=0)


def gather_no_grad(x: torch.Tensor, left_out: bool = False) -> torch.Tensor:
    """Concatenate ``x`` (labels, ids) from every process, no gradient; lengths may differ."""
    rank, size = world()
    if size == 1:
        return x
    x = x[:0] if left_out else x
    sizes = _sizes(x, size)
    xp = _pad(x.detach(), max(sizes))
    out = [torch.empty_like(xp) for _ in range(size)]
    dist.all_gather(out, xp)
    return torch.cat([p[:n] for p, n in zip(out, sizes, strict=True)], dim=0)


def own_rows(n: int, device: torch.device, left_out: bool = False) -> tuple[int, int]:
    """Where this process's ``n`` rows sit in the gathered batch: (first row, number of rows), the
    number 0 when they are ``left_out``."""
    rank, size = world()
    if size == 1:
        return 0, n
    sizes = _sizes(torch.empty((0 if left_out else n,), device=device), size)
    return sum(sizes[:rank]), sizes[rank]
