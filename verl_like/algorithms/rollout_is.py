"""Importance-sampling weights between the rollout engine's policy and the trainer's old policy.

vLLM's log-probs differ from the training engine's for the same weights (kernels, precision), so the samples are
slightly off-policy. A truncated or masked importance weight pi_old / pi_rollout corrects for it; the policy loss
multiplies its per-token loss by these weights (``rollout_is_weights=``).
"""

from __future__ import annotations

import math

import torch

from verl_like.algorithms.masked import check_same_shape, compute_dtype, masked_max, masked_mean, masked_min
from verl_like.config.loss_options import RolloutISConfig

# exp() of a log-weight is only taken after clamping into [log lower, log upper], so no inf can appear.


def compute_rollout_is_weights(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    config: RolloutISConfig,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Detached IS weights `(batch, response_len)` (0 on padding) and their metrics.

    token:     w_t = pi_old(y_t) / pi_rollout(y_t)
    sequence:  w_t = prod_{valid s} pi_old(y_s) / pi_rollout(y_s)             (same for every token of a row)
    geometric: w_t = (prod_{valid s} pi_old(y_s) / pi_rollout(y_s))^(1/|y|)
    truncate: min(w, threshold); mask: w if lower <= w <= threshold else 0.
    Paper: Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training" (truncated IS,
    token level); truncated IS after Espeholt et al. 2018, IMPALA (arXiv:1802.01561).
    Deviation: sequence/geometric levels and mask mode are extensions of the token-level TIS of the blog.
    """
    check_same_shape(old_log_probs=old_log_probs, rollout_log_probs=rollout_log_probs, response_mask=response_mask)
    dtype = compute_dtype(old_log_probs, rollout_log_probs)
    mask = response_mask.bool()
    log_ratio = torch.where(mask, old_log_probs.detach().to(dtype) - rollout_log_probs.detach().to(dtype), 0.0)
    if config.level == "token":
        log_weight = log_ratio
    else:
        per_seq = log_ratio.sum(-1)
        if config.level == "geometric":
            per_seq = per_seq / mask.sum(-1).clamp_min(1).to(dtype)
        log_weight = per_seq.unsqueeze(-1).expand_as(log_ratio)
    log_upper = math.log(config.threshold)
    if config.mode == "truncate":
        changed = log_weight > log_upper
        weights = torch.exp(log_weight.clamp(max=log_upper))
    else:
        log_lower = math.log(config.lower)
        changed = (log_weight > log_upper) | (log_weight < log_lower)
        weights = torch.where(changed, 0.0, torch.exp(log_weight.clamp(min=log_lower, max=log_upper)))
    weights = torch.where(mask, weights, 0.0)
    metrics = {
        "rollout_is/mean": masked_mean(weights, mask),
        "rollout_is/max": masked_max(weights, mask),
        "rollout_is/min": masked_min(weights, mask),
        "rollout_is/clipped_frac": masked_mean(changed.to(dtype), mask),
        # k1 estimate of KL(pi_rollout || pi_old): how far the engines disagree.
        "rollout_is/mismatch_kl": masked_mean(-log_ratio, mask),
    }
    return weights, metrics
