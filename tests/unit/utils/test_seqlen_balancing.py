"""Sequence-length balancing: partitions are valid, balanced within LPT's bound, and respect token budgets."""

import itertools
import random

import pytest

from verl_like.utils import seqlen_balancing
from verl_like.utils.seqlen_balancing import (
    balanced_partition,
    min_parts_within_budget,
    partition_within_budget,
    split_to_count,
)


def _sums(groups, weights):
    return [sum(weights[i] for i in group) for group in groups]


def _assert_is_partition(groups, n):
    flat = sorted(i for group in groups for i in group)
    assert flat == list(range(n))
    assert all(group for group in groups)
    assert all(group == sorted(group) for group in groups)


def _optimal_makespan(weights, parts, equal_size=False):
    """Brute force over all assignments: the smallest possible largest group sum."""
    best = None
    size = len(weights) // parts
    for assignment in itertools.product(range(parts), repeat=len(weights)):
        counts = [assignment.count(p) for p in range(parts)]
        if min(counts) == 0 or (equal_size and any(c != size for c in counts)):
            continue
        loads = [0] * parts
        for index, part in enumerate(assignment):
            loads[part] += weights[index]
        best = max(loads) if best is None else min(best, max(loads))
    return best


def test_balanced_partition_is_within_lpt_bound_of_the_optimum():
    rng = random.Random(0)
    for _ in range(60):
        n = rng.randint(3, 8)
        parts = rng.randint(1, min(3, n))
        weights = [rng.randint(0, 20) for _ in range(n)]
        groups = balanced_partition(weights, parts)
        assert len(groups) == parts
        _assert_is_partition(groups, n)
        bound = (4 / 3 - 1 / (3 * parts)) * _optimal_makespan(weights, parts)
        assert max(_sums(groups, weights)) <= bound + 1e-9


def test_balanced_partition_orders_groups_by_decreasing_sum():
    weights = [5, 1, 9, 3, 7, 2]
    sums = _sums(balanced_partition(weights, 3), weights)
    assert sums == sorted(sums, reverse=True)


def test_balanced_partition_keeps_groups_non_empty_with_zero_weights():
    groups = balanced_partition([0, 0, 0, 0], 3)
    _assert_is_partition(groups, 4)
    assert sorted(len(g) for g in groups) == [1, 1, 2]


def test_equal_size_partition_gives_equal_counts_and_reasonable_balance():
    rng = random.Random(1)
    for _ in range(30):
        parts = rng.randint(2, 3)
        n = parts * rng.randint(1, 3)
        weights = [rng.randint(1, 30) for _ in range(n)]
        groups = balanced_partition(weights, parts, equal_size=True)
        _assert_is_partition(groups, n)
        assert {len(group) for group in groups} == {n // parts}
        optimum = _optimal_makespan(weights, parts, equal_size=True)
        assert max(_sums(groups, weights)) <= optimum + max(weights)


def test_equal_size_greedy_example():
    # Sorted 10, 4, 3, 1 -> {10}, {4} -> {10}, {4, 3} -> {4, 3} is full -> {10, 1}.
    assert balanced_partition([1, 10, 3, 4], 2, equal_size=True) == [[0, 1], [2, 3]]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: balanced_partition([1, 2], 3), "cannot fill 3"),
        (lambda: balanced_partition([1, 2, 3], 2, equal_size=True), "multiple of num_parts=2"),
        (lambda: balanced_partition([1, -2], 1), "negative"),
        (lambda: balanced_partition([1], 0), "num_parts=0"),
        (lambda: min_parts_within_budget([3, 9], 8), "raise max_tokens_per_rank to at least 9"),
        (lambda: min_parts_within_budget([], 8), "no items"),
        (lambda: partition_within_budget([4, 4], 8, 3), "cannot fill 3 micro-batches"),
        (lambda: partition_within_budget([5, 5, 5], 8, 2), "at least 3 are needed"),
    ],
)
def test_invalid_requests_raise_specific_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_min_parts_within_budget_is_the_smallest_fitting_count():
    rng = random.Random(2)
    for _ in range(60):
        n = rng.randint(1, 7)
        weights = [rng.randint(1, 10) for _ in range(n)]
        budget = rng.randint(max(weights), sum(weights) + 1)
        parts = min_parts_within_budget(weights, budget)
        assert max(_sums(balanced_partition(weights, parts), weights)) <= budget
        if parts > 1:
            assert max(_sums(balanced_partition(weights, parts - 1), weights)) > budget


def test_partition_within_budget_gives_exactly_the_requested_count_within_budget():
    rng = random.Random(3)
    for _ in range(60):
        n = rng.randint(2, 9)
        weights = [rng.randint(1, 12) for _ in range(n)]
        budget = rng.randint(max(weights), 2 * max(weights))
        fewest = min_parts_within_budget(weights, budget)
        for parts in range(fewest, n + 1):
            groups = partition_within_budget(weights, budget, parts)
            assert len(groups) == parts
            _assert_is_partition(groups, n)
            assert max(_sums(groups, weights)) <= budget


def test_split_to_count_never_grows_a_group_sum():
    weights = [8, 1, 1, 6, 2]
    groups = split_to_count([[0, 1, 2], [3, 4]], weights, 4)
    _assert_is_partition(groups, 5)
    assert len(groups) == 4
    assert max(_sums(groups, weights)) <= 10
    with pytest.raises(ValueError, match="cannot fill 6"):
        split_to_count([[0, 1, 2], [3, 4]], weights, 6)


def test_partition_within_budget_falls_back_to_splitting_when_greedy_overflows(monkeypatch):
    """If greedy with the requested count overflows the budget, a fitting partition is split instead."""
    real = seqlen_balancing.balanced_partition
    weights = [6, 5, 4, 3]

    def greedy_overflowing_at_three(w, parts, equal_size=False):
        if len(w) == 4 and parts == 3:
            return [[0, 1], [2], [3]]  # 11 tokens > budget 10
        return real(w, parts, equal_size)

    monkeypatch.setattr(seqlen_balancing, "balanced_partition", greedy_overflowing_at_three)
    groups = partition_within_budget(weights, 10, 3)
    assert len(groups) == 3
    _assert_is_partition(groups, 4)
    assert max(_sums(groups, weights)) <= 10


def test_balanced_order_is_a_permutation_with_equal_balanced_slices():
    rng = random.Random(7)
    weights = [rng.randint(1, 100) for _ in range(24)]
    order = seqlen_balancing.balanced_order(weights, 4)
    assert sorted(order) == list(range(24))
    slices = [order[i * 6 : (i + 1) * 6] for i in range(4)]
    sums = [sum(weights[i] for i in part) for part in slices]
    # Equal-size LPT: within the largest weight of the mean, far better than the sorted (worst) order.
    assert max(sums) - min(sums) <= max(weights)
    worst = sorted(weights)
    worst_sums = [sum(worst[i * 6 : (i + 1) * 6]) for i in range(4)]
    assert max(sums) < max(worst_sums)
    with pytest.raises(ValueError, match="multiple of num_parts"):
        seqlen_balancing.balanced_order(weights[:23], 4)
