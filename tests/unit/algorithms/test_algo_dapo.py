"""DAPO overlong reward shaping and the dynamic-sampling group filter."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import algo_reference as ref
from verl_like.algorithms import (
    add_to_last_valid_token,
    apply_overlong_penalty,
    filter_zero_variance_groups,
    overlong_reward_penalty,
)


@pytest.mark.parametrize(("max_len", "buffer_len", "factor"), [(20, 8, 1.0), (20, 20, 0.5), (16, 1, 2.0)])
def test_overlong_penalty_matches_piecewise_reference(max_len: int, buffer_len: int, factor: float) -> None:
    lengths = torch.arange(0, max_len + 4)
    got = overlong_reward_penalty(lengths, max_response_length=max_len, overlong_buffer_len=buffer_len,
                                  penalty_factor=factor)
    expected = torch.tensor([ref.overlong_penalty(n, max_len, buffer_len, factor) for n in lengths.tolist()])
    ref.assert_close(got, expected, rtol=1e-6, atol=1e-7)
    assert got[max_len].item() == pytest.approx(-factor) and got[max_len - buffer_len].item() == 0.0


def test_overlong_penalty_lands_on_each_rows_last_valid_token() -> None:
    rows = [[1, 1, 1, 1, 1, 1], [1, 1, 0, 1, 1, 0], [0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]]
    mask = torch.tensor(rows, dtype=torch.bool)
    scores = torch.zeros(4, 6)
    scores[0, 5], scores[1, 4], scores[3, 0] = 1.0, 1.0, 1.0
    shaped, penalty = apply_overlong_penalty(scores, mask, max_response_length=6, overlong_buffer_len=4,
                                             penalty_factor=1.0)
    # lengths 6, 4, 0, 1: expected = 2, penalties -1, -0.5, 0, 0
    assert penalty.tolist() == pytest.approx([-1.0, -0.5, 0.0, 0.0])
    expected = scores.clone()
    expected[0, 5] += -1.0
    expected[1, 4] += -0.5
    ref.assert_close(shaped, expected)
    ref.assert_close(add_to_last_valid_token(scores, mask, torch.ones(4)).sum(-1), torch.tensor([2.0, 2.0, 0.0, 2.0]))


def test_overlong_config_is_validated() -> None:
    with pytest.raises(ValueError, match="overlong_buffer.len"):
        overlong_reward_penalty(torch.ones(2), max_response_length=4, overlong_buffer_len=5, penalty_factor=1.0)
    with pytest.raises(ValueError, match="overlong_buffer.len"):
        overlong_reward_penalty(torch.ones(2), max_response_length=4, overlong_buffer_len=0, penalty_factor=1.0)
    with pytest.raises(ValueError, match="penalty_factor"):
        overlong_reward_penalty(torch.ones(2), max_response_length=4, overlong_buffer_len=2, penalty_factor=-1.0)


def _groups_reference(index, values):
    groups: dict = {}
    for uid, v in zip(index, values):
        groups.setdefault(uid, []).append(v)
    return [len(set(groups[uid])) > 1 for uid in index], sum(len(set(v)) > 1 for v in groups.values()), len(groups)


@pytest.mark.parametrize("as_type", ["list", "numpy", "tensor"])
def test_group_filter_keeps_only_groups_with_reward_variance(as_type: str) -> None:
    gen = torch.Generator().manual_seed(0)
    index = [f"p{int(i)}" for i in torch.randint(0, 6, (40,), generator=gen)] + ["solo"]
    values = [float(v) for v in torch.randint(0, 2, (41,), generator=gen)]
    index[:3], values[:3] = ["same", "same", "same"], [1.0, 1.0, 1.0]
    keep_ref, kept_ref, groups_ref = _groups_reference(index, values)
    if as_type == "numpy":
        result = filter_zero_variance_groups(np.array(index, dtype=object), np.array(values))
    elif as_type == "tensor":
        ids = torch.tensor([sorted(set(index)).index(u) for u in index])
        result = filter_zero_variance_groups(ids, torch.tensor(values))
    else:
        result = filter_zero_variance_groups(index, values)
    assert result.keep_mask.dtype == torch.bool and result.keep_mask.tolist() == keep_ref
    assert (result.num_kept_groups, result.num_groups) == (kept_ref, groups_ref)
    assert not result.keep_mask[:3].any() and not result.keep_mask[-1], "all-equal group and singleton are dropped"


def test_group_filter_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="index has 3 entries but metric_values has 2"):
        filter_zero_variance_groups([0, 0, 1], [1.0, 0.0])
