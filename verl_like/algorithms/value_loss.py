"""Critic loss: clipped squared error between predicted values and returns."""

from __future__ import annotations

import torch

from verl_like.algorithms.aggregation import LossNormalizer, aggregate_loss
from verl_like.algorithms.masked import check_same_shape, compute_dtype, masked_mean
from verl_like.algorithms.policy_loss import LossOutput


def compute_value_loss(
    vpreds: torch.Tensor,
    values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    normalizer: LossNormalizer,
    cliprange_value: float | None,
) -> LossOutput:
    """Clipped value loss over `(batch, response_len)` inputs; scalar loss and metrics.

    v_clip = values + clip(vpreds - values, -c, c);  l = 0.5 max((vpreds - R)^2, (v_clip - R)^2);  c = None: no clip.
    `values` are the critic's predictions at rollout time, `vpreds` the current ones, `returns` the targets.
    Metrics: vf_loss (this micro-batch's share), vf_clipfrac (clipped branch larger), vpred_mean.
    Paper: value clipping from OpenAI baselines' PPO2, analysed in Engstrom et al. 2020, "Implementation Matters in
    Deep Policy Gradients" (arXiv:2005.12729).
    Deviation: none beyond optional clipping (``critic.cliprange_value: null`` turns it off).
    """
    check_same_shape(vpreds=vpreds, values=values, returns=returns, response_mask=response_mask)
    if cliprange_value is not None and not cliprange_value > 0:
        raise ValueError(f"critic.cliprange_value={cliprange_value} must be > 0 (or null to disable clipping)")
    dtype = compute_dtype(vpreds, values, returns)
    mask = response_mask.bool()
    vpreds = torch.where(mask, vpreds.to(dtype), 0.0)
    values = torch.where(mask, values.detach().to(dtype), 0.0)
    returns = torch.where(mask, returns.detach().to(dtype), 0.0)
    unclipped = (vpreds - returns) ** 2
    if cliprange_value is None:
        loss_mat = 0.5 * unclipped
        clipfrac = torch.zeros((), dtype=dtype, device=vpreds.device)
    else:
        vclipped = values + (vpreds - values).clamp(-cliprange_value, cliprange_value)
        clipped = (vclipped - returns) ** 2
        loss_mat = 0.5 * torch.maximum(unclipped, clipped)
        clipfrac = masked_mean((clipped > unclipped).to(dtype), mask)
    loss = aggregate_loss(loss_mat, mask, normalizer)
    metrics = {
        "vf_loss": loss.detach() / normalizer.grad_scale,
        "vf_clipfrac": clipfrac.detach(),
        "vpred_mean": masked_mean(vpreds.detach(), mask),
    }
    return LossOutput(loss, metrics)
