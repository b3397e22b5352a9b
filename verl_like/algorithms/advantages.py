"""Advantage estimators: token-level rewards (+ values / group ids) -> advantages and returns.

Every estimator is registered by name (config key ``algorithm.adv_estimator``) with one signature,
``fn(inputs: AdvantageInputs, config: AdvantageConfig) -> (advantages, returns)``, both ``(batch, response_len)``;
each raises if an input it needs is missing from `inputs`.

Conventions shared by all estimators:
- Tokens outside ``response_mask`` are not time steps: rewards there are ignored, the step after a valid token is
  the next valid token (so multi-turn masks with holes work), and advantages/returns there are 0.
- Outputs are float32 (float64 when the rewards are float64).
- Group estimators give a group of one zero advantage (its own score is its baseline); verl instead passes the raw
  score through. Use ``rollout.n >= 2`` with them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from verl_like.algorithms.masked import (
    check_same_shape,
    compute_dtype,
    group_ids,
    group_mean_std,
    masked_whiten,
)
from verl_like.algorithms.registry import get_advantage_estimator, register_advantage_estimator

logger = logging.getLogger(__name__)

Index = torch.Tensor | np.ndarray | Sequence
# (advantages, returns), both (batch, response_len)
AdvantagesAndReturns = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class AdvantageConfig:
    """Knobs of the advantage estimators (config node ``algorithm``).

    gamma: discount (``algorithm.gamma``), used by gae and reinforce_plus_plus.
    lam: GAE lambda (``algorithm.lam``).
    norm_adv_by_std_in_grpo: divide by the group std in grpo; False gives Dr.GRPO
        (``algorithm.norm_adv_by_std_in_grpo``).
    epsilon: added to the group std before dividing (grpo).
    """

    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True
    epsilon: float = 1e-6

    def __post_init__(self) -> None:
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"algorithm.gamma={self.gamma} must lie in [0, 1]")
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"algorithm.lam={self.lam} must lie in [0, 1]")
        if not self.epsilon > 0.0:
            raise ValueError(f"advantage epsilon={self.epsilon} must be > 0 (it guards a division by the group std)")


@dataclass(frozen=True)
class AdvantageInputs:
    """What the estimators read. Shapes: `(batch, response_len)` unless stated.

    token_level_rewards: reward per token (outcome rewards sit on the last valid token).
    response_mask: bool or 0/1, which tokens are the policy's own (padding and tool output are not).
    index: `(batch,)` group uids (int tensor, numpy array or list); the responses to one prompt share a uid.
        Needed by grpo, rloo, reinforce_plus_plus_baseline.
    values: critic values at rollout time; needed by gae.
    reward_baselines: `(batch,)` reward of the greedy response to the same prompt; needed by remax.
    """

    token_level_rewards: torch.Tensor
    response_mask: torch.Tensor
    index: Index | None = None
    values: torch.Tensor | None = None
    reward_baselines: torch.Tensor | None = None

    def __post_init__(self) -> None:
        check_same_shape(token_level_rewards=self.token_level_rewards, response_mask=self.response_mask,
                         values=self.values)
        if self.token_level_rewards.dim() != 2:
            raise ValueError(
                f"token_level_rewards must be (batch, response_len), got {tuple(self.token_level_rewards.shape)}"
            )
        batch = self.token_level_rewards.shape[0]
        if self.index is not None and len(self.index) != batch:
            raise ValueError(f"index has {len(self.index)} entries but token_level_rewards has {batch} rows")
        if self.reward_baselines is not None and tuple(self.reward_baselines.shape) != (batch,):
            raise ValueError(f"reward_baselines must be (batch,)=({batch},), got {tuple(self.reward_baselines.shape)}")


AdvantageEstimator = Callable[[AdvantageInputs, AdvantageConfig], AdvantagesAndReturns]


def compute_advantage(adv_estimator: str, inputs: AdvantageInputs, config: AdvantageConfig) -> AdvantagesAndReturns:
    """Advantages and returns `(batch, response_len)` from the estimator named `adv_estimator`."""
    return get_advantage_estimator(adv_estimator)(inputs, config)


def _prepare(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards in the compute dtype with padding zeroed, and the bool mask."""
    mask = inputs.response_mask.bool()
    rewards = inputs.token_level_rewards.to(compute_dtype(inputs.token_level_rewards))
    return torch.where(mask, rewards, torch.zeros_like(rewards)), mask


def _require(value: object, argument: str, estimator: str) -> None:
    if value is None:
        raise ValueError(f"advantage estimator {estimator!r} needs `{argument}`; set AdvantageInputs.{argument}")


_warned_singletons = False


def _sequence_scores_and_groups(
    rewards: torch.Tensor, index: Index | None, estimator: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Outcome scores `(batch,)` with their group mean, unbiased group std and group size, each `(batch,)`."""
    global _warned_singletons
    _require(index, "index", estimator)
    ids = group_ids(index, device=rewards.device)
    scores = rewards.sum(-1)
    mean, std, size = group_mean_std(scores, ids)
    if not _warned_singletons and bool((size < 2).any()):
        _warned_singletons = True
        logger.warning("%s: some groups hold one response; they get zero advantage (set rollout.n >= 2)", estimator)
    return scores, mean, std, size


def _discounted_scan(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> torch.Tensor:
    """GAE advantages over the valid tokens; with values=0 and lam=1 these are the discounted returns."""
    advantages = torch.zeros_like(rewards)
    next_value = rewards.new_zeros(rewards.shape[0])
    running = rewards.new_zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        valid = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        current = delta + gamma * lam * running
        running = torch.where(valid, current, running)
        next_value = torch.where(valid, values[:, t], next_value)
        advantages[:, t] = torch.where(valid, current, torch.zeros_like(current))
    return advantages


@register_advantage_estimator("gae")
def gae_advantage(inputs: AdvantageInputs, config: AdvantageConfig) -> AdvantagesAndReturns:
    """Generalised advantage estimation: whitened advantages and critic returns, `(batch, response_len)`.

    delta_t = r_t + gamma V_{t+1} - V_t;  A_t = sum_k (gamma lam)^k delta_{t+k};  returns_t = A_t + V_t;
    then A is whitened over all valid tokens of the batch.
    Paper: Schulman et al. 2016, "High-Dimensional Continuous Control Using GAE" (arXiv:1506.02438).
    Deviation: V after the last valid token is 0 (the response ends the episode).
    Deviation: whitening of the advantages (a PPO implementation habit, not in the paper), unbiased variance.
    """
    rewards, mask = _prepare(inputs)
    _require(inputs.values, "values", "gae")
    values = torch.where(mask, inputs.values.detach().to(rewards.dtype), torch.zeros_like(rewards))
    advantages = _discounted_scan(rewards, values, mask, config.gamma, config.lam)
    returns = (advantages + values) * mask
    return masked_whiten(advantages, mask), returns


@register_advantage_estimator("grpo")
def grpo_advantage(inputs: AdvantageInputs, config: AdvantageConfig) -> AdvantagesAndReturns:
    """Group-relative outcome advantage broadcast to the valid tokens; returns == advantages, `(batch, response_len)`.

    A_i = (R_i - mean_g(R)) / (std_g(R) + epsilon), R_i = sum_t r_it; without the std division when
    ``norm_adv_by_std_in_grpo`` is False (Dr.GRPO).
    Paper: Shao et al. 2024, "DeepSeekMath" (arXiv:2402.03300); Dr.GRPO: Liu et al. 2025, "Understanding
    R1-Zero-Like Training: A Critical Perspective" (arXiv:2503.20783).
    Deviation: std is the unbiased sample std; epsilon is added to it for groups whose rewards are all equal.
    Deviation: a group of one gets zero advantage.
    """
    rewards, mask = _prepare(inputs)
    scores, mean, std, _ = _sequence_scores_and_groups(rewards, inputs.index, "grpo")
    centered = scores - mean
    if config.norm_adv_by_std_in_grpo:
        centered = centered / (std + config.epsilon)
    advantages = centered.unsqueeze(-1) * mask
    return advantages, advantages


@register_advantage_estimator("rloo")
def rloo_advantage(inputs: AdvantageInputs, config: AdvantageConfig) -> AdvantagesAndReturns:
    """REINFORCE leave-one-out advantage broadcast to the valid tokens; returns == advantages.

    A_i = R_i - (sum_{j in g, j != i} R_j) / (n_g - 1).
    Paper: Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization" (arXiv:2402.14740),
    after Kool et al. 2019, "Buy 4 REINFORCE Samples, Get a Baseline for Free!".
    Deviation: a group of one (no other sample to form a baseline) gets zero advantage.
    """
    rewards, mask = _prepare(inputs)
    scores, mean, _, size = _sequence_scores_and_groups(rewards, inputs.index, "rloo")
    # R_i - (n mean - R_i)/(n-1) == n/(n-1) (R_i - mean); a singleton has R_i == mean, so 0.
    centered = (scores - mean) * size / (size - 1).clamp_min(1)
    advantages = centered.unsqueeze(-1) * mask
    return advantages, advantages


@register_advantage_estimator("reinforce_plus_plus")
def reinforce_plus_plus_advantage(inputs: AdvantageInputs, config: AdvantageConfig) -> AdvantagesAndReturns:
    """REINFORCE++: discounted token returns whitened over the batch; returns are the unwhitened returns.

    G_t = sum_{k>=t} gamma^(k-t) r_k over valid tokens;  A = (G - mean(G)) / std(G) over all valid tokens.
    Paper: Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning LLMs" (arXiv:2501.03262).
    Deviation: the per-token KL penalty of the paper is not folded in here; apply it to the rewards first
    (``apply_kl_penalty``) or use the KL loss.
    """
    rewards, mask = _prepare(inputs)
    returns = _discounted_scan(rewards, torch.zeros_like(rewards), mask, config.gamma, 1.0)
    return masked_whiten(returns, mask), returns


@register_advantage_estimator("reinforce_plus_plus_baseline")
def reinforce_plus_plus_baseline_advantage(inputs: AdvantageInputs, config: AdvantageConfig) -> AdvantagesAndReturns:
    """REINFORCE++-baseline: group-mean-centred outcome broadcast to tokens, then whitened over the batch.

    A_it = whiten_batch(R_i - mean_g(R)) over all valid tokens; returns == advantages.
    Paper: Hu 2025, "REINFORCE++" (arXiv:2501.03262, v3+ "REINFORCE++-baseline").
    Deviation: a group of one gets a centred score of 0 before whitening.
    """
    rewards, mask = _prepare(inputs)
    scores, mean, _, _ = _sequence_scores_and_groups(rewards, inputs.index, "reinforce_plus_plus_baseline")
    advantages = masked_whiten((scores - mean).unsqueeze(-1) * mask, mask)
    return advantages, advantages


@register_advantage_estimator("remax")
def remax_advantage(inputs: AdvantageInputs, config: AdvantageConfig) -> AdvantagesAndReturns:
    """ReMax: reward-to-go minus the greedy response's reward; returns are the reward-to-go.

    A_t = sum_{k>=t} r_k - b, with b = reward of the greedy (argmax) response to the same prompt,
    ``reward_baselines`` `(batch,)`.
    Paper: Li et al. 2023, "ReMax: A Simple, Effective, and Efficient RL Method for Aligning LLMs" (arXiv:2310.10505).
    Deviation: none (no discount, as in the paper; ``algorithm.gamma`` is not used).
    """
    rewards, mask = _prepare(inputs)
    _require(inputs.reward_baselines, "reward_baselines", "remax")
    returns = _discounted_scan(rewards, torch.zeros_like(rewards), mask, 1.0, 1.0)
    advantages = (returns - inputs.reward_baselines.to(rewards.dtype).unsqueeze(-1)) * mask
    return advantages, returns
