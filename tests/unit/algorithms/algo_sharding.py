"""Helpers that split a mini-batch into DP shards and micro-batches the way a trainer does, for gradient tests."""

from __future__ import annotations

from typing import Callable

import torch


def shard_plan(batch: int, num_shards: int, gen: torch.Generator) -> list[list[torch.Tensor]]:
    """Rows of each DP shard (uneven contiguous split), each shard cut into micro-batches of 1-4 rows."""
    cuts = sorted(torch.randperm(batch - 1, generator=gen)[: num_shards - 1].add(1).tolist())
    bounds = [0, *cuts, batch]
    plan = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        micro, start = [], lo
        while start < hi:
            size = int(torch.randint(1, 5, (1,), generator=gen))
            micro.append(torch.arange(start, min(start + size, hi)))
            start += size
        plan.append(micro)
    return plan


def trimmed_length(mask: torch.Tensor, rows: torch.Tensor) -> int:
    """Length a micro-batch is re-padded to: its own last valid column + 1 (shorter than the mini-batch's)."""
    valid_cols = torch.nonzero(mask[rows].any(0)).flatten()
    return int(valid_cols.max()) + 1 if valid_cols.numel() else 1


def accumulated_grad(
    param: torch.Tensor, micro_batches: list[torch.Tensor], mask: torch.Tensor,
    loss_of: Callable[[torch.Tensor, int], torch.Tensor],
) -> torch.Tensor:
    """Gradient of `param` summed over micro-batches; loss_of(rows, length) returns one micro-batch's loss."""
    param.grad = None
    for rows in micro_batches:
        loss_of(rows, trimmed_length(mask, rows)).backward()
    grad = param.grad.clone()
    param.grad = None
    return grad
