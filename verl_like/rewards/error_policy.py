"""What happens when scoring fails: `reward_model.error_policy` and `reward_model.max_error_fraction`.

A sample's scoring fails when its reward function raises, returns something that is not a finite number, runs
past reward_model.scoring_timeout_s, kills its process, or its data_source has no scorer. Failed samples are
always counted (`reward/errors`, `reward/timeouts`, and `val/reward/errors` in validation). Then:
  fail: they score 0, but a batch where more than max_error_fraction of the samples failed stops the run with
        a RewardError naming the counts and the first failure (the default: never train on a batch of zeros);
  zero: they score 0 and the run goes on (verl's behaviour), with a warning per batch;
  skip: they are left out of the update (their response_mask is zeroed) and of the validation mean; a batch past
        max_error_fraction stops the run as with fail, since too little would be left to train on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from verl_like.config.names import ERROR_POLICIES



class RewardError(RuntimeError):
    """Too many samples of a batch failed to score (reward_model.error_policy=fail or skip)."""


@dataclass(frozen=True)
class FailedSample:
    """One sample whose scoring failed: its index in the batch, data source, and why."""

    index: int
    data_source: str
    error: str
    timed_out: bool = False


def check_error_budget(
    failed: Sequence[FailedSample], batch_size: int, policy: str, max_error_fraction: float, timeout_s: float
) -> None:
    """Raises RewardError when `policy` is fail or skip and more than `max_error_fraction` of the batch failed."""
    if policy not in ERROR_POLICIES:
        raise ValueError(f"reward_model.error_policy={policy!r} must be one of {ERROR_POLICIES}")
    if policy == "zero" or not failed or len(failed) <= max_error_fraction * batch_size:
        return
    raise RewardError(
        f"reward scoring failed for {len(failed)} of {batch_size} samples, more than "
        f"reward_model.max_error_fraction={max_error_fraction}: {describe_failures(failed, timeout_s)}. Fix the "
        "reward function (custom_reward_function.path / .name, or the rule scorer of that data_source); "
        "reward_model.error_policy=zero trains on 0 for failed samples instead"
    )


def describe_failures(failed: Sequence[FailedSample], timeout_s: float) -> str:
    """'3 raised or returned a non-number, 1 timed out after 30 s; first: sample 0 (data_source 'x'): ...'."""
    timed_out = sum(f.timed_out for f in failed)
    first = failed[0]
    sources = sorted({f.data_source for f in failed})
    return (
        f"{len(failed) - timed_out} raised or returned a non-number, {timed_out} timed out after "
        f"reward_model.scoring_timeout_s={timeout_s}; data sources {sources[:5]}; first: sample {first.index} "
        f"(data_source {first.data_source!r}): {first.error}"
    )
