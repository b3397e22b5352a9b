"""Per-token KL estimators between the policy and the reference, and the KL loss term.

Let d = log pi(y_t) - log pi_ref(y_t) at the sampled token (Schulman 2020, "Approximating KL Divergence",
joschu.net/blog/kl-approx.html):  k1 = d,  k2 = d^2 / 2,  k3 = exp(-d) + d - 1,  abs = |d|.
"k1+"/"k3+" return k1/k3's value with k2's gradient (d * grad log pi), which is the gradient of KL(pi || pi_ref)
on samples of pi (Tang & Munos 2025, "On a Few Pitfalls in KL Divergence Gradient Estimation for RL",
arXiv:2506.09477).
"""

from __future__ import annotations

import torch

from verl_like.algorithms.aggregation import LossNormalizer, aggregate_loss
from verl_like.algorithms.masked import check_same_shape, compute_dtype
from verl_like.algorithms.policy_loss import LossOutput
from verl_like.algorithms.registry import get_kl_estimator, register_kl_estimator

# k3 takes exp(-d): d is clamped first so it cannot overflow, and k3 is capped (an outlier token must not
# dominate the batch; the gradient is 0 beyond the cap).
K3_LOG_RATIO_CLAMP = 20.0
K3_MAX = 10.0


def _log_ratio(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    check_same_shape(log_probs=log_probs, ref_log_probs=ref_log_probs)
    dtype = compute_dtype(log_probs, ref_log_probs)
    return log_probs.to(dtype) - ref_log_probs.detach().to(dtype)


@register_kl_estimator("k1", "kl")
def kl_k1(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """k1 = log pi - log pi_ref, `(batch, response_len)`: unbiased for KL(pi || pi_ref), high variance.

    Paper: Schulman 2020, "Approximating KL Divergence".  Deviation: none.
    """
    return _log_ratio(log_probs, ref_log_probs)


@register_kl_estimator("abs")
def kl_abs(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """|log pi - log pi_ref|, `(batch, response_len)`: a biased, non-negative proxy.

    Paper: none (a common implementation choice).  Deviation: n/a.
    """
    return _log_ratio(log_probs, ref_log_probs).abs()


@register_kl_estimator("k2", "mse")
def kl_k2(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """k2 = (log pi - log pi_ref)^2 / 2, `(batch, response_len)`: low variance, biased; its gradient is KL's.

    Paper: Schulman 2020, "Approximating KL Divergence".  Deviation: none.
    """
    return 0.5 * _log_ratio(log_probs, ref_log_probs) ** 2


@register_kl_estimator("k3", "low_var_kl")
def kl_k3(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """k3 = pi_ref/pi - 1 - log(pi_ref/pi), `(batch, response_len)`: unbiased, non-negative, low variance.

    Paper: Schulman 2020, "Approximating KL Divergence"; used as GRPO's KL loss (arXiv:2402.03300).
    Deviation: log(pi_ref/pi) clamped to +-20 before exp, and k3 capped at 10 (gradient 0 beyond).
    """
    neg = (-_log_ratio(log_probs, ref_log_probs)).clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
    return (torch.exp(neg) - neg - 1.0).clamp(max=K3_MAX)


def _straight_through(value: torch.Tensor, gradient_source: torch.Tensor) -> torch.Tensor:
    return gradient_source + (value - gradient_source).detach()


@register_kl_estimator("k1+")
def kl_k1_straight_through(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """Value of k1, gradient of k2, `(batch, response_len)`.

    Paper: Tang & Munos 2025 (arXiv:2506.09477) on KL gradients.  Deviation: none.
    """
    return _straight_through(kl_k1(log_probs, ref_log_probs), kl_k2(log_probs, ref_log_probs))


@register_kl_estimator("k3+")
def kl_k3_straight_through(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """Value of k3 (clamped as in k3), gradient of k2, `(batch, response_len)`.

    Paper: Tang & Munos 2025 (arXiv:2506.09477) on KL gradients.  Deviation: k3's clamps apply to the value.
    """
    return _straight_through(kl_k3(log_probs, ref_log_probs), kl_k2(log_probs, ref_log_probs))


def kl_estimate(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL estimate `(batch, response_len)` with the estimator named `estimator`."""
    return get_kl_estimator(estimator)(log_probs, ref_log_probs)


def compute_kl_loss(
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    normalizer: LossNormalizer,
    kl_loss_type: str,
) -> LossOutput:
    """KL to the reference as a loss term (``actor.use_kl_loss``), aggregated like the policy loss.

    The caller adds ``actor.kl_loss_coef`` times this loss. Inputs `(batch, response_len)`; metric kl_loss.
    Paper: GRPO (arXiv:2402.03300) uses k3 as a loss instead of a reward penalty.
    Deviation: none beyond the estimator's own.
    """
    check_same_shape(log_probs=log_probs, ref_log_probs=ref_log_probs, response_mask=response_mask)
    mask = response_mask.bool()
    # Zero padding first: pad positions may hold -inf log-probs.
    safe_lp = torch.where(mask, log_probs, torch.zeros_like(log_probs))
    safe_ref = torch.where(mask, ref_log_probs, torch.zeros_like(ref_log_probs))
    loss = aggregate_loss(kl_estimate(safe_lp, safe_ref, kl_loss_type), mask, normalizer)
    return LossOutput(loss, {"kl_loss": loss.detach() / normalizer.grad_scale})
