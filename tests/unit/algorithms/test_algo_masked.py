"""Masked reductions and group ids."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import algo_reference as ref
from verl_like.algorithms import group_ids, masked_mean, masked_sum, masked_whiten
from verl_like.algorithms.masked import group_mean_std, masked_max, masked_min, masked_var


def test_masked_reductions_match_loops() -> None:
    gen = torch.Generator().manual_seed(0)
    mask = ref.random_mask(6, 5, gen)
    x = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    valid = [x[i, t].item() for i in range(6) for t in range(5) if mask[i, t]]
    mean = sum(valid) / len(valid)
    assert masked_sum(x, mask).item() == pytest.approx(sum(valid))
    assert masked_mean(x, mask).item() == pytest.approx(mean)
    assert masked_var(x, mask).item() == pytest.approx(sum((v - mean) ** 2 for v in valid) / (len(valid) - 1))
    assert masked_max(x, mask).item() == max(valid) and masked_min(x, mask).item() == min(valid)
    rows = masked_mean(x, mask, dim=-1)
    assert rows[-1].item() == 0.0, "an empty row has mean 0, not NaN"
    ref.assert_close(masked_whiten(x, mask), torch.tensor(ref.whiten(x.tolist(), mask.tolist()), dtype=torch.float64))


def test_reductions_with_nothing_or_one_valid() -> None:
    x = torch.randn(2, 3)
    none = torch.zeros(2, 3, dtype=torch.bool)
    assert masked_mean(x, none).item() == 0.0 and masked_max(x, none).item() == 0.0
    one = none.clone()
    one[0, 1] = True
    assert masked_var(x, one).item() == 0.0
    assert torch.equal(masked_whiten(x, one), torch.zeros_like(x))


def test_group_ids_accept_tensors_arrays_and_lists() -> None:
    expected = [1, 0, 1, 2, 0]
    assert group_ids(torch.tensor([5, 2, 5, 9, 2])).tolist() == expected
    assert group_ids(np.array(["b", "a", "b", "c", "a"], dtype=object)).tolist() == expected
    assert group_ids(["b", "a", "b", "c", "a"]).tolist() == expected
    with pytest.raises(ValueError, match="index must be 1-D"):
        group_ids(torch.zeros(2, 2))
    with pytest.raises(ValueError, match="index must be 1-D"):
        group_ids(np.zeros((2, 2)))


def test_group_mean_std_per_sample() -> None:
    scores = torch.tensor([1.0, 3.0, 10.0, 2.0], dtype=torch.float64)
    mean, std, size = group_mean_std(scores, torch.tensor([0, 0, 1, 0]))
    assert mean.tolist() == pytest.approx([2.0, 2.0, 10.0, 2.0])
    assert std.tolist() == pytest.approx([1.0, 1.0, 0.0, 1.0]) and size.tolist() == [3, 3, 1, 3]
    assert not math.isnan(std.sum().item())
