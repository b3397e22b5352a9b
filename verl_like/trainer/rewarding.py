"""The score of each response: rule/custom scorers and, when enabled, the reward-model role, combined.

`reward_model.combine` decides how the two meet (docs/config.md):
  "add":     token_level_scores = rule score + RM score (both on the last valid response token);
  "replace": token_level_scores = RM score; the rule scorers are not called (verl's naive reward manager
             returns rm_scores as they are when the batch has them).
Without a reward model the rule score is the score. DAPO's overlong penalty is added afterwards by the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
    """

    scores: torch.Tensor
    rule_scores: torch.Tensor | None
    rm_scores: torch.Tensor | None
    metrics: dict[str, float]


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
        """Scores `batch` (responses, response_mask, the model inputs and the scorers' non-tensor columns)."""
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
        if rm_scores is None or self.combine == "add":
            rule_scores, rule_metrics = self.reward_manager.score(batch)
            metrics.update(rule_metrics)
        return Scored(combine_scores(rule_scores, rm_scores, self.combine), rule_scores, rm_scores, metrics)
