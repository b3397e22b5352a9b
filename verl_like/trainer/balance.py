"""`trainer.balance_batch`: reorder a batch so each data-parallel rank gets as many rows and about as many tokens.

The worker groups cut a DP-dispatched batch into dp_size consecutive chunks, one per DP rank (every worker with
fsdp2, megatron's DP ranks otherwise: `DerivedSizes.actor_dp_size`); with responses of very different lengths one
rank can get much more work than another and the others wait for it. Reordering
the rows (a permutation applied to every tensor and non-tensor column alike) fixes that. Nothing downstream
depends on the row order: advantages group samples by their "uid", not by position, and ReMax's greedy
baselines are computed before the reorder. The PPO mini-batches then hold other samples than without it (each
mini-batch is a slice of every rank's rows), which changes the optimisation path but not its expectation.
"""

from __future__ import annotations

import torch

from verl_like.protocol import DataProto
from verl_like.utils.seqlen_balancing import balanced_order


def rank_token_loads(lengths: torch.Tensor, num_ranks: int) -> torch.Tensor:
    """Valid tokens each rank gets when `lengths` `(batch,)` is cut into `num_ranks` consecutive equal chunks."""
    return lengths.reshape(num_ranks, -1).sum(dim=1)


def balance_batch(batch: DataProto, num_ranks: int) -> tuple[DataProto, dict[str, float]]:
    """`batch` reordered for `num_ranks` DP ranks, and metrics of the token imbalance before and after.

    balance/imbalance_before, balance/imbalance_after: the busiest rank's valid tokens over the mean rank's
    (1.0 is perfect). A batch whose row count does not divide by `num_ranks` comes back unchanged (the DP
    dispatch would pad it anyway).
    """
    if num_ranks < 1:
        raise ValueError(f"balance_batch: num_ranks={num_ranks} must be >= 1")
    if num_ranks == 1 or len(batch) % num_ranks:
        return batch, {}
    lengths = batch.batch["attention_mask"].sum(dim=1)
    order = balanced_order(lengths.tolist(), num_ranks)
    before = rank_token_loads(lengths, num_ranks).double()
    after = rank_token_loads(lengths[order], num_ranks).double()
    metrics = {
        "balance/imbalance_before": (before.max() / before.mean()).item() if before.mean() > 0 else 1.0,
        "balance/imbalance_after": (after.max() / after.mean()).item() if after.mean() > 0 else 1.0,
    }
    return batch.reorder(order), metrics
