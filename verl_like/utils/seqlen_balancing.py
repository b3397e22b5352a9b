"""Partitioning sequences by token count: balanced groups, and micro-batches under a token budget.

Pure index logic on integer weights (a sequence's weight is its number of valid tokens); no torch, no collectives.
The engine uses `min_parts_within_budget` to find how many micro-batches a rank needs, agrees on the maximum over
ranks, then asks `partition_within_budget` for exactly that many. The driver reorders each batch by
`balanced_order` (trainer.balance_batch) so that the data-parallel ranks get the same number of rows and similar
work.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def _check_weights(weights: Sequence[int], op: str) -> None:
    for index, weight in enumerate(weights):
        if weight < 0:
            raise ValueError(f"{op}: weights[{index}]={weight} is negative; weights are token counts (>= 0)")


def balanced_partition(weights: Sequence[int], num_parts: int, equal_size: bool = False) -> list[list[int]]:
    """`num_parts` groups of indices into `weights` with sums as even as the greedy rule makes them.

    Longest-processing-time greedy: indices in decreasing weight go to the group with the smallest sum (with
    `equal_size`, the smallest sum among groups not yet holding `len(weights) // num_parts` indices). Without
    `equal_size` the largest group sum is at most (4/3 - 1/(3 * num_parts)) times the optimum. Each group is
    non-empty and its indices are sorted; groups are ordered by decreasing sum (ties: smallest first index).
    """
    op = "balanced_partition"
    if num_parts < 1:
        raise ValueError(f"{op}: num_parts={num_parts} must be >= 1")
    if len(weights) < num_parts:
        raise ValueError(f"{op}: {len(weights)} items cannot fill {num_parts} non-empty groups; lower num_parts")
    if equal_size and len(weights) % num_parts:
        raise ValueError(
            f"{op}: equal_size needs the item count ({len(weights)}) to be a multiple of num_parts={num_parts}"
        )
    _check_weights(weights, op)
    capacity = len(weights) // num_parts if equal_size else len(weights)
    order = sorted(range(len(weights)), key=lambda i: (-weights[i], i))
    groups: list[list[int]] = [[] for _ in range(num_parts)]
    sums = [0] * num_parts
    # Ties on the sum go to the group with fewer items, so the first num_parts items (even of weight 0) seed one
    # group each and no group stays empty.
    heap = [(0, 0, part) for part in range(num_parts)]
    for index in order:
        load, count, part = heapq.heappop(heap)
        groups[part].append(index)
        sums[part] = load + weights[index]
        if count + 1 < capacity:
            heapq.heappush(heap, (sums[part], count + 1, part))
    result = [sorted(group) for group in groups]
    result.sort(key=lambda group: (-sum(weights[i] for i in group), group[0]))
    return result


def _fits(groups: list[list[int]], weights: Sequence[int], budget: int) -> bool:
    return all(sum(weights[i] for i in group) <= budget for group in groups)


def min_parts_within_budget(weights: Sequence[int], budget: int) -> int:
    """The fewest groups for which `balanced_partition` keeps every group sum <= `budget`."""
    op = "min_parts_within_budget"
    if budget < 1:
        raise ValueError(f"{op}: budget={budget} must be >= 1 token")
    _check_weights(weights, op)
    if not weights:
        raise ValueError(f"{op}: got no items to partition")
    largest = max(weights)
    if largest > budget:
        raise ValueError(
            f"{op}: a sequence has {largest} tokens, more than the budget of {budget}; raise max_tokens_per_rank "
            f"to at least {largest}"
        )
    parts = max(1, -(-sum(weights) // budget))
    while not _fits(balanced_partition(weights, parts), weights, budget):
        parts += 1  # terminates: with len(weights) parts every group holds one item, which fits
    return parts


def split_to_count(groups: list[list[int]], weights: Sequence[int], num_parts: int) -> list[list[int]]:
    """`groups` refined to `num_parts` groups by splitting the largest-sum group (of >= 2 items) in two, repeatedly.

    No group sum grows, so a partition within a budget stays within it.
    """
    if num_parts > sum(len(group) for group in groups):
        raise ValueError(f"split_to_count: {sum(map(len, groups))} items cannot fill {num_parts} non-empty groups")
    groups = [list(group) for group in groups]
    while len(groups) < num_parts:
        candidates = [g for g in range(len(groups)) if len(groups[g]) >= 2]
        target = max(candidates, key=lambda g: (sum(weights[i] for i in groups[g]), -g))
        group = groups[target]
        halves = balanced_partition([weights[i] for i in group], 2)
        groups[target : target + 1] = [sorted(group[j] for j in half) for half in halves]
    return groups


def partition_within_budget(weights: Sequence[int], budget: int, num_parts: int) -> list[list[int]]:
    """Exactly `num_parts` non-empty groups, each summing to <= `budget`, as balanced as the greedy rule allows.

    `num_parts` must be at least `min_parts_within_budget(weights, budget)` (a larger count comes from another
    rank needing more micro-batches) and at most `len(weights)`.
    """
    op = "partition_within_budget"
    if num_parts > len(weights):
        raise ValueError(
            f"{op}: {len(weights)} sequences cannot fill {num_parts} micro-batches; another rank needs "
            f"{num_parts} micro-batches under max_tokens_per_rank={budget}: give every rank at least {num_parts} "
            "sequences, or raise max_tokens_per_rank"
        )
    groups = balanced_partition(weights, num_parts)
    if _fits(groups, weights, budget):
        return groups
    fewest = min_parts_within_budget(weights, budget)
    if num_parts < fewest:
        raise ValueError(
            f"{op}: {num_parts} micro-batches cannot hold these sequences under max_tokens_per_rank={budget}; "
            f"at least {fewest} are needed"
        )
    # Greedy with more groups can in principle do worse than with fewer; splitting a fitting partition never does.
    return split_to_count(balanced_partition(weights, fewest), weights, num_parts)


def balanced_order(weights: Sequence[int], num_parts: int) -> list[int]:
    """A permutation of range(len(weights)) whose `num_parts` consecutive equal slices have balanced sums.

    The driver reorders a batch with it before a data-parallel dispatch that cuts the batch into `num_parts`
    consecutive chunks: each rank then gets the same number of rows and about the same number of tokens
    (`balanced_partition(..., equal_size=True)`; the item count must be a multiple of num_parts).
    """
    return [index for group in balanced_partition(weights, num_parts, equal_size=True) for index in group]
