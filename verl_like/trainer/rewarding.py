"""The score of each response: rule/custom scorers and, when enabled, the reward-model role, combined.

`reward_model.combine` decides how the two meet (docs/config.md):
  "add":     token_level_scores = rule score + RM score (both on the last valid response token);
  "replace": token_level_scores = RM score; the rule scorers are not called (verl's naive reward manager
             returns rm_scores as they are when the batch has them).
Without a reward model the rule score is the score. DAPO's overlong penalty is added afterwards by the trainer.

With reward_model.error_policy=skip, samples whose rule scoring failed are left out of the update: their
response_mask is zeroed, and their rule score is set to the mean of the scored samples of their group (uid), so
group baselines (GRPO, RLOO) are those of the scored samples. Departure: GRPO's std still counts the group's size
with them, which shrinks it slightly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from verl_like.config.reward import RM_COMBINE_MODES
from verl_like.protocol import DataProto


def combine_scores(rule_scores: torch.Tensor | None, rm_scores: torch.Tensor | None, mode: str) -> torch.Tensor:
    """token_level_scores `(batch, response_len)` from the rule and RM scores (either may be None)."""
    if mode not in RM_COMBINE_MODES:
        raise ValueError(f"reward_model.combine={mode!r} must be one of {RM_COMBINE_MODES}")
    if rm_scores is None:
        if rule_scores is None:
            raise ValueError("combine_scores: neither rule scores nor reward-model scores were given")
        return rule_scores
    if mode == "replace":
        return rm_scores.float()
    if rule_scores is None:
        raise ValueError("reward_model.combine='add' needs the rule scores as well as the reward model's")
    if rule_scores.shape != rm_scores.shape:
        raise ValueError(f"rule scores {tuple(rule_scores.shape)} and rm_scores {tuple(rm_scores.shape)} differ in shape")
    return rule_scores.float() + rm_scores.float()


@dataclass
class Scored:
    """What scoring a batch gives.

    scores: token_level_scores `(batch, response_len)` (before any overlong penalty).
    rule_scores: the rule/custom scorers' `(batch, response_len)`, None when they did not run ("replace").
    rm_scores: the reward model's `(batch, response_len)`, None without one.
    metrics: reward/* metrics of the batch.
    failed: `(batch,)` bool, True where the rule scoring failed (all False when the rule scorers did not run).
    """

    scores: torch.Tensor
    rule_scores: torch.Tensor | None
    rm_scores: torch.Tensor | None
    metrics: dict[str, float]
    failed: torch.Tensor | None = None


def fill_failed_with_group_mean(
    rule_scores: torch.Tensor, failed: torch.Tensor, response_mask: torch.Tensor, groups: np.ndarray | None
) -> torch.Tensor:
    """rule_scores `(batch, response_len)` where each failed row holds the mean score of its group's scored rows
    (0 when none scored), on its last valid token. groups: `(batch,)` group ids (None: one group)."""
    out = rule_scores.clone()
    per_row = rule_scores.sum(-1)
    ids = np.zeros(len(per_row), dtype=object) if groups is None else np.asarray(groups, dtype=object)
    last = (response_mask.sum(-1) - 1).clamp_min(0)
    for row in torch.nonzero(failed).flatten().tolist():
        peers = torch.tensor([ids[j] == ids[row] for j in range(len(ids))]) & ~failed
        value = per_row[peers].mean() if peers.any() else per_row.new_zeros(())
        out[row] = 0
        out[row, last[row]] = value
    return out


class BatchScorer:
    """Scores rollout batches with the reward manager and, if given, the reward-model role of a worker group.

    reward_manager: verl_like.rewards.manager.RewardManager (rule or custom scorer).
    reward_model: a group role with a DP-dispatched `compute_rm_score` (RewardModelWorker), or None.
    combine: reward_model.combine ("add" or "replace").
    """

    def __init__(self, reward_manager: Any, reward_model: Any | None, combine: str) -> None:
        if combine not in RM_COMBINE_MODES:
            raise ValueError(f"reward_model.combine={combine!r} must be one of {RM_COMBINE_MODES}")
        self.reward_manager = reward_manager
        self.reward_model = reward_model
        self.combine = combine

    def score(self, batch: DataProto) -> Scored:
        """Scores `batch` (responses, response_mask, the model inputs and the scorers' non-tensor columns).

        With reward_model.error_policy=skip, zeroes the response_mask of `batch`'s failed samples in place (see
        the module doc); the reward manager raises RewardError when too many failed.
        """
        metrics: dict[str, float] = {}
        rm_scores = None
        if self.reward_model is not None:
            rm_scores = self.reward_model.compute_rm_score(batch).batch["rm_scores"]
            per_sequence = rm_scores.double().sum(-1)
            metrics.update({
                "reward/rm_score_mean": per_sequence.mean().item(),
                "reward/rm_score_max": per_sequence.max().item(),
                "reward/rm_score_min": per_sequence.min().item(),
            })
        rule_scores = None
        failed = None
        if rm_scores is None or self.combine == "add":
            result = self.reward_manager.score_batch(batch)
            rule_scores, failed = result.token_level_scores, result.failed_mask()
            metrics.update(result.metrics)
            if failed.any() and self.reward_manager.error_policy == "skip":
                mask = batch.batch["response_mask"]
                rule_scores = fill_failed_with_group_mean(rule_scores, failed, mask, batch.non_tensor_batch.get("uid"))
                batch.batch["response_mask"] = mask.masked_fill(failed[:, None], 0)
        scores = combine_scores(rule_scores, rm_scores, self.combine)
        return Scored(scores, rule_scores, rm_scores, metrics, failed)
