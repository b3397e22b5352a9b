"""DAPO's reward shaping for overlong responses and the zero-variance group filter of dynamic sampling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from verl_like.algorithms.masked import check_same_shape, compute_dtype, group_ids


def overlong_reward_penalty(
    response_lengths: torch.Tensor,
    *,
    max_response_length: int,
    overlong_buffer_len: int,
    penalty_factor: float,
) -> torch.Tensor:
    """Soft overlong punishment `(batch,)` for response lengths `(batch,)`.

    With L_max = max_response_length, B = overlong_buffer_len, f = penalty_factor:
    0 if L <= L_max - B;  f ((L_max - B) - L) / B if L_max - B < L <= L_max;  -f if L > L_max.
    Paper: Yu et al. 2025, DAPO (arXiv:2503.14476), "Soft Overlong Punishment".
    Deviation: the factor f (``reward_model.overlong_buffer.penalty_factor``) scales the paper's penalty (f=1).
    """
    if not 0 < overlong_buffer_len <= max_response_length:
        raise ValueError(
            f"reward_model.overlong_buffer.len={overlong_buffer_len} must lie in (0, max_response_length="
            f"{max_response_length}]"
        )
    if penalty_factor < 0:
        raise ValueError(f"reward_model.overlong_buffer.penalty_factor={penalty_factor} must be >= 0")
    lengths = response_lengths.to(torch.float64 if response_lengths.dtype == torch.float64 else torch.float32)
    expected = max_response_length - overlong_buffer_len
    ramp = (expected - lengths) / overlong_buffer_len * penalty_factor
    penalty = torch.where(lengths > max_response_length, torch.full_like(lengths, -penalty_factor), ramp)
    return penalty.clamp(max=0.0)


def add_to_last_valid_token(
    token_level_scores: torch.Tensor, response_mask: torch.Tensor, sequence_values: torch.Tensor
) -> torch.Tensor:
    """`token_level_scores` `(batch, response_len)` with `sequence_values` `(batch,)` added at each row's last
    valid token (rows without a valid token are unchanged)."""
    check_same_shape(token_level_scores=token_level_scores, response_mask=response_mask)
    mask = response_mask.bool()
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, -1).max(-1).values
    dtype = compute_dtype(token_level_scores)
    addition = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    addition[rows, last[rows]] = sequence_values.to(dtype)[rows]
    return token_level_scores.to(dtype) + addition


def apply_overlong_penalty(
    token_level_scores: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    max_response_length: int,
    overlong_buffer_len: int,
    penalty_factor: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores `(batch, response_len)` with the overlong penalty added at the last valid token, and the penalty
    `(batch,)`; the response length is the number of valid tokens of each row.

    Paper and deviations: see overlong_reward_penalty.
    """
    penalty = overlong_reward_penalty(
        response_mask.sum(-1),
        max_response_length=max_response_length,
        overlong_buffer_len=overlong_buffer_len,
        penalty_factor=penalty_factor,
    )
    return add_to_last_valid_token(token_level_scores, response_mask, penalty), penalty


@dataclass(frozen=True)
class GroupFilterResult:
    """Which samples dynamic sampling keeps: keep_mask `(batch,)` bool, and group counts for logging."""

    keep_mask: torch.Tensor
    num_groups: int
    num_kept_groups: int


def filter_zero_variance_groups(
    index: torch.Tensor | np.ndarray | Sequence, metric_values: torch.Tensor | np.ndarray | Sequence
) -> GroupFilterResult:
    """Keep the groups whose `metric_values` `(batch,)` (e.g. sequence score or accuracy) are not all equal.

    Returns a CPU keep_mask, whatever device the inputs are on.

    A group whose responses all score the same gives every response zero group-relative advantage, i.e. no
    gradient; DAPO drops such groups and samples more prompts (``algorithm.filter_groups.enable``).
    Paper: Yu et al. 2025, DAPO (arXiv:2503.14476), "Dynamic Sampling".
    Deviation: a group of one counts as zero-variance and is dropped (verl keeps it).
    """
    if isinstance(metric_values, torch.Tensor):
        values = metric_values.detach().to(device="cpu", dtype=torch.float64)
    else:
        values = torch.as_tensor(np.asarray(metric_values, dtype=np.float64))
    ids = group_ids(index)
    if ids.shape[0] != values.shape[0]:
        raise ValueError(f"index has {ids.shape[0]} entries but metric_values has {values.shape[0]}")
    num_groups = int(ids.max().item()) + 1 if ids.numel() else 0
    group_max = torch.full((num_groups,), float("-inf"), dtype=torch.float64).scatter_reduce(0, ids, values, "amax")
    group_min = torch.full((num_groups,), float("inf"), dtype=torch.float64).scatter_reduce(0, ids, values, "amin")
    varied = group_max > group_min
    return GroupFilterResult(keep_mask=varied[ids], num_groups=num_groups, num_kept_groups=int(varied.sum()))
