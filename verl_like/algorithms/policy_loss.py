"""Policy losses: per-token surrogate -> aggregated scalar loss with metrics, selected by name.

Registered losses share one signature, ``fn(inputs: PolicyLossInputs, *, normalizer, config) -> LossOutput``;
the loss mode is config key ``actor.policy_loss.loss_mode``. Every loss needs a :class:`LossNormalizer` built for
the whole mini-batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

from verl_like.algorithms.aggregation import LossNormalizer, aggregate_loss
from verl_like.algorithms.masked import check_same_shape, compute_dtype, masked_max, masked_mean, masked_min
from verl_like.algorithms.registry import get_policy_loss, register_policy_loss
from verl_like.config.loss_options import PolicyLossConfig

# Log-ratios are clamped to +-LOG_RATIO_CLAMP before exp(): exp(20) ~ 5e8 stays finite in fp32 and bf16.
LOG_RATIO_CLAMP = 20.0


class LossOutput(NamedTuple):
    """A loss to backpropagate and its detached scalar metrics (micro-batch token means unless stated)."""

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor]


@dataclass(frozen=True)
class PolicyLossInputs:
    """One micro-batch for a policy loss; every tensor `(batch, response_len)`.

    old_log_probs: log-probs of the sampled tokens under the policy that generated the batch (recomputed by the
        training engine), no gradient.
    log_probs: the same under the current policy, with gradient.
    advantages: from an advantage estimator.
    response_mask: bool or 0/1; padding may hold anything (even -inf), it is zeroed before use.
    rollout_is_weights: optional detached weights from compute_rollout_is_weights, multiplying the per-token loss.
    """

    old_log_probs: torch.Tensor
    log_probs: torch.Tensor
    advantages: torch.Tensor
    response_mask: torch.Tensor
    rollout_is_weights: torch.Tensor | None = None

    def __post_init__(self) -> None:
        check_same_shape(
            old_log_probs=self.old_log_probs,
            log_probs=self.log_probs,
            advantages=self.advantages,
            response_mask=self.response_mask,
            rollout_is_weights=self.rollout_is_weights,
        )

    def prepared(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(old, new, advantages, mask) in the compute dtype with padding zeroed (so -inf there cannot poison
        gradients); old and advantages detached."""
        dtype = compute_dtype(self.log_probs, self.old_log_probs)
        mask = self.response_mask.bool()
        zero = torch.zeros((), dtype=dtype, device=self.log_probs.device)
        new = torch.where(mask, self.log_probs.to(dtype), zero)
        old = torch.where(mask, self.old_log_probs.detach().to(dtype), zero)
        adv = torch.where(mask, self.advantages.detach().to(dtype), zero)
        return old, new, adv, mask


# The built-in losses whose every token's loss is its advantage times a finite factor (the ratio is clamped), so
# that a row with advantage 0 on all its response tokens adds exactly nothing to the gradient. A loss registered
# by a user is not assumed to be one.
ADVANTAGE_WEIGHTED_LOSSES = frozenset({"vanilla", "gspo", "gpg"})

PolicyLossFn = Callable[..., LossOutput]  # fn(inputs: PolicyLossInputs, *, normalizer, config) -> LossOutput


def compute_policy_loss(
    loss_mode: str, inputs: PolicyLossInputs, *, normalizer: LossNormalizer, config: PolicyLossConfig
) -> LossOutput:
    """The policy loss named `loss_mode` on one micro-batch (see the registered functions for formulas)."""
    return get_policy_loss(loss_mode)(inputs, normalizer=normalizer, config=config)


def _finish(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    normalizer: LossNormalizer,
    rollout_is_weights: torch.Tensor | None,
    metrics: dict[str, torch.Tensor],
) -> LossOutput:
    if rollout_is_weights is not None:
        weights = rollout_is_weights.detach().to(loss_mat.dtype)
        loss_mat = loss_mat * weights
        metrics["is_weight_mean"] = masked_mean(weights, mask)
        metrics["is_weight_max"] = masked_max(weights, mask)
        metrics["is_weight_min"] = masked_min(weights, mask)
    loss = aggregate_loss(loss_mat, mask, normalizer)
    # The micro-batch's share of the mini-batch loss: summing it over micro-batches and DP ranks gives the loss.
    metrics["pg_loss"] = loss.detach() / normalizer.grad_scale
    return LossOutput(loss, {k: v.detach() for k, v in metrics.items()})


def _clipped_surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, config: PolicyLossConfig, dual_clip: bool
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    low, high = 1.0 - config.clip_ratio_low, 1.0 + config.clip_ratio_high
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(low, high)
    loss = torch.maximum(unclipped, clipped)
    dtype = loss.dtype
    metrics = {
        "pg_clipfrac": masked_mean((clipped > unclipped).to(dtype), mask),
        "pg_clipfrac_ratio_high": masked_mean(((ratio > high) & (adv > 0)).to(dtype), mask),
        "pg_clipfrac_ratio_low": masked_mean(((ratio < low) & (adv < 0)).to(dtype), mask),
    }
    # verl's name and meaning: the share of tokens where the dual-clip bound -A c is active (A < 0); 0 without it.
    metrics["pg_clipfrac_lower"] = torch.zeros((), dtype=dtype, device=loss.device)
    if dual_clip and config.clip_ratio_c is not None:
        bound = -adv * config.clip_ratio_c
        metrics["pg_clipfrac_lower"] = masked_mean(((adv < 0) & (loss > bound)).to(dtype), mask)
        loss = torch.where(adv < 0, torch.minimum(loss, bound), loss)
    return loss, metrics


@register_policy_loss("vanilla")
def ppo_clip_loss(inputs: PolicyLossInputs, *, normalizer: LossNormalizer, config: PolicyLossConfig) -> LossOutput:
    """PPO clipped surrogate with asymmetric clip and dual-clip; inputs `(batch, response_len)`, scalar loss.

    r = pi / pi_old;  l = max(-A r, -A clip(r, 1 - low, 1 + high));  for A < 0: l = min(l, -A c).
    Metrics: pg_loss, pg_clipfrac (tokens whose ratio is clipped = ratio_high + ratio_low, as verl's),
    pg_clipfrac_ratio_high (A > 0, r > 1 + high), pg_clipfrac_ratio_low (A < 0, r < 1 - low), pg_clipfrac_lower
    (verl's: A < 0 and the dual-clip bound -A c active), approx_kl (mean of log pi_old - log pi), is_weight_*
    when weights are given.
    Paper: Schulman et al. 2017, PPO (arXiv:1707.06347); clip-higher: Yu et al. 2025, DAPO (arXiv:2503.14476);
    dual-clip: Ye et al. 2020 (arXiv:1912.09729).
    Deviation: log(r) is clamped to +-20 before exp so extreme ratios stay finite.
    Deviation: optional rollout IS weights multiply the per-token loss (not in PPO).
    """
    old, new, adv, mask = inputs.prepared()
    log_ratio = (new - old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    loss_mat, metrics = _clipped_surrogate(torch.exp(log_ratio), adv, mask, config, dual_clip=True)
    metrics["approx_kl"] = masked_mean(-log_ratio.detach(), mask)
    return _finish(loss_mat, mask, normalizer, inputs.rollout_is_weights, metrics)


@register_policy_loss("gspo")
def gspo_loss(inputs: PolicyLossInputs, *, normalizer: LossNormalizer, config: PolicyLossConfig) -> LossOutput:
    """GSPO: clipped surrogate on the length-normalised sequence ratio; inputs `(batch, response_len)`.

    s_i = exp(mean_t (log pi - log pi_old));  token form s_it = sg(s_i) pi(y_t) / sg(pi(y_t)) (value s_i,
    gradient s_i grad log pi(y_t));  l_it = max(-A s_it, -A clip(s_it, 1 - low, 1 + high)).
    With ``seq-mean-token-mean`` aggregation this is the paper's objective; other modes weight sequences differently.
    Paper: Zheng et al. 2025, "Group Sequence Policy Optimization" (arXiv:2507.18071), GSPO-token form.
    Deviation: log s_i is clamped to +-20 before exp; clip_ratio_c (dual-clip) is not applied.
    Deviation: optional rollout IS weights multiply the per-token loss.
    """
    old, new, adv, mask = inputs.prepared()
    log_ratio = new - old
    seq_log_ratio = log_ratio.sum(-1) / mask.sum(-1).clamp_min(1).to(log_ratio.dtype)
    seq_log_ratio = seq_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).detach()
    token_log_ratio = new - new.detach() + seq_log_ratio.unsqueeze(-1)
    loss_mat, metrics = _clipped_surrogate(torch.exp(token_log_ratio), adv, mask, config, dual_clip=False)
    metrics["approx_kl"] = masked_mean(-log_ratio.detach(), mask)
    return _finish(loss_mat, mask, normalizer, inputs.rollout_is_weights, metrics)


@register_policy_loss("gpg")
def policy_gradient_loss(
    inputs: PolicyLossInputs, *, normalizer: LossNormalizer, config: PolicyLossConfig
) -> LossOutput:
    """Plain policy gradient (REINFORCE / GPG): l_t = -A_t log pi(y_t); inputs `(batch, response_len)`.

    No ratio and no clipping: it is on-policy (one update per batch); `config` is unused.
    Metrics: pg_loss, approx_kl (mean of log pi_old - log pi, 0 on-policy), is_weight_* when weights are given.
    Paper: Williams 1992, REINFORCE; Chu et al. 2025, "GPG: A Simple and Strong RL Baseline for Model Reasoning"
    (arXiv:2504.02546).
    Deviation: GPG's own advantage (group mean without std, scaled by the valid fraction) is not built in; pair
    with adv_estimator=grpo and norm_adv_by_std_in_grpo=false for the unscaled form.
    """
    old, new, adv, mask = inputs.prepared()
    metrics = {"approx_kl": masked_mean((old - new).detach(), mask)}
    return _finish(-adv * new, mask, normalizer, inputs.rollout_is_weights, metrics)
