"""KL as a reward penalty: fixed or adaptive coefficient controllers and the reward-shaping helper."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from verl_like.algorithms.kl import kl_estimate
from verl_like.algorithms.masked import check_same_shape, compute_dtype
from verl_like.config.names import KL_CTRL_TYPES



class KLController(Protocol):
    """A KL coefficient (``value``) that may adapt to the measured KL after each step."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None: ...


@dataclass
class FixedKLController:
    """Constant coefficient ``algorithm.kl_ctrl.kl_coef``."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing to adapt."""


@dataclass
class AdaptiveKLController:
    """Proportional controller that steers the measured KL towards ``target_kl``.

    e = clip(KL / target_kl - 1, -0.2, 0.2);  beta <- beta (1 + e n_steps / horizon).
    Paper: Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences" (arXiv:1909.08593).
    Deviation: none.
    """

    value: float
    target_kl: float
    horizon: int

    def __post_init__(self) -> None:
        if not self.target_kl > 0:
            raise ValueError(f"algorithm.kl_ctrl.target_kl={self.target_kl} must be > 0 for the adaptive controller")
        if not self.horizon > 0:
            raise ValueError(f"algorithm.kl_ctrl.horizon={self.horizon} must be > 0 for the adaptive controller")

    def update(self, current_kl: float, n_steps: int) -> None:
        """Adapt the coefficient after `n_steps` samples whose mean KL was `current_kl`."""
        error = min(max(current_kl / self.target_kl - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


def build_kl_controller(
    kl_ctrl_type: str, kl_coef: float, target_kl: float | None = None, horizon: int | None = None
) -> FixedKLController | AdaptiveKLController:
    """Controller from ``algorithm.kl_ctrl.{type, kl_coef, target_kl, horizon}``."""
    if kl_coef < 0:
        raise ValueError(f"algorithm.kl_ctrl.kl_coef={kl_coef} must be >= 0")
    if kl_ctrl_type == "fixed":
        return FixedKLController(value=float(kl_coef))
    if kl_ctrl_type == "adaptive":
        if target_kl is None or horizon is None:
            raise ValueError("algorithm.kl_ctrl.type='adaptive' needs algorithm.kl_ctrl.target_kl and .horizon set")
        return AdaptiveKLController(value=float(kl_coef), target_kl=float(target_kl), horizon=int(horizon))
    raise ValueError(f"algorithm.kl_ctrl.type={kl_ctrl_type!r} must be one of {KL_CTRL_TYPES}")


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    kl_ctrl: KLController,
    kl_penalty: str = "k1",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level rewards `(batch, response_len)` = scores - beta * KL_t, then the controller is updated.

    KL_t is the ``algorithm.kl_penalty`` estimate between the rollout-time policy (old_log_probs) and the reference,
    0 on padding. The measured KL (mean over sequences of each sequence's mean token KL, sequences with a valid
    token only) updates `kl_ctrl` with n_steps = batch size. Metrics: kl (measured), kl_coef (beta used).
    Paper: per-token KL reward of Ziegler et al. 2019 (arXiv:1909.08593) and InstructGPT (arXiv:2203.02155).
    Deviation: none.
    """
    check_same_shape(
        token_level_scores=token_level_scores,
        old_log_probs=old_log_probs,
        ref_log_probs=ref_log_probs,
        response_mask=response_mask,
    )
    mask = response_mask.bool()
    dtype = compute_dtype(token_level_scores, old_log_probs, ref_log_probs)
    zero = torch.zeros((), dtype=dtype, device=token_level_scores.device)
    old = torch.where(mask, old_log_probs.detach().to(dtype), zero)
    ref = torch.where(mask, ref_log_probs.detach().to(dtype), zero)
    kl = torch.where(mask, kl_estimate(old, ref, kl_penalty), zero)
    beta = float(kl_ctrl.value)
    rewards = token_level_scores.to(dtype) - beta * kl
    counts = mask.sum(-1)
    has_tokens = counts > 0
    per_seq = kl.sum(-1) / counts.clamp_min(1).to(dtype)
    current_kl = float((per_seq * has_tokens).sum() / has_tokens.sum().clamp_min(1))
    kl_ctrl.update(current_kl, n_steps=token_level_scores.shape[0])
    return rewards, {"kl": current_kl, "kl_coef": beta}
