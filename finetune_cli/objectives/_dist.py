"""Gathering across processes *with* gradients, for in-batch contrastive objectives.

``torch.distributed.all_gather`` returns tensors cut off from autograd, so a loss computed on the
gathered batch would only train on the local rows' part of the similarity matrix.
``torch.distributed.nn.functional.all_gather`` is differentiable: the backward all-reduces the
gradient of each gathered block back to its owner, so every process gets the gradient it would
get if one process had computed the loss on the concatenated batch (scaled by the world size, since
each process computes the same global loss and DDP then averages the gradients).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """Concatenate ``x`` from every process along dim 0 (rank order), keeping gradients.

    Single process: returns ``x`` unchanged. All processes must pass the same shape.
    """
    rank, size = world()
    if size == 1:
        return x
    from torch.distributed.nn.functional import all_gather

    return torch.cat(all_gather(x.contiguous()), dim=0)


def gather_no_grad(x: torch.Tensor) -> torch.Tensor:
    """Concatenate ``x`` (labels, ids) from every process, no gradient."""
    rank, size = world()
    if size == 1:
        return x
    out = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(out, x.contiguous())
    return torch.cat(out, dim=0)
