"""The option objects the loss functions take, built from config keys: torch-free, so the config validates them.

`ActorConfig.policy_loss_config()` builds a PolicyLossConfig, `AlgorithmConfig.rollout_is_config()` a
RolloutISConfig; verl_like.algorithms re-exports both (policy_loss.py and rollout_is.py use them).
"""

from __future__ import annotations

from dataclasses import dataclass

from verl_like.config.names import ROLLOUT_IS_LEVELS, ROLLOUT_IS_MODES


@dataclass(frozen=True)
class PolicyLossConfig:
    """Clipping of the policy losses (config node ``actor``).

    clip_ratio_low / clip_ratio_high: ratio is clipped to [1 - low, 1 + high] (``actor.clip_ratio_low``,
        ``actor.clip_ratio_high``; DAPO's clip-higher sets high > low; GSPO wants ~3e-4 / 4e-4).
    clip_ratio_c: dual-clip bound for negative advantages, > 1, or None to disable (``actor.clip_ratio_c``).
    """

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float | None = 3.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.clip_ratio_low < 1.0:
            raise ValueError(f"actor.clip_ratio_low={self.clip_ratio_low} must lie in [0, 1)")
        if not self.clip_ratio_high >= 0.0:
            raise ValueError(f"actor.clip_ratio_high={self.clip_ratio_high} must be >= 0")
        if self.clip_ratio_c is not None and not self.clip_ratio_c > 1.0:
            raise ValueError(f"actor.clip_ratio_c={self.clip_ratio_c} must be > 1 (or null to disable dual-clip)")


@dataclass(frozen=True)
class RolloutISConfig:
    """Rollout-vs-old importance sampling (config node ``algorithm``; enabled by ``algorithm.rollout_is``).

    level: ``algorithm.rollout_is_level``: "token" (per-token ratio), "sequence" (product over the response),
        "geometric" (geometric mean over the response's tokens).
    mode: ``algorithm.rollout_is_mode``: "truncate" (w = min(w, threshold)) or "mask" (w = 0 outside
        [threshold_lower, threshold]).
    threshold: ``algorithm.rollout_is_threshold``, upper bound, > 1.
    threshold_lower: ``algorithm.rollout_is_threshold_lower``, mask mode only, in (0, 1); default 1/threshold.
    """

    level: str = "token"
    mode: str = "truncate"
    threshold: float = 2.0
    threshold_lower: float | None = None

    def __post_init__(self) -> None:
        if self.level not in ROLLOUT_IS_LEVELS:
            raise ValueError(f"algorithm.rollout_is_level={self.level!r} must be one of {ROLLOUT_IS_LEVELS}")
        if self.mode not in ROLLOUT_IS_MODES:
            raise ValueError(f"algorithm.rollout_is_mode={self.mode!r} must be one of {ROLLOUT_IS_MODES}")
        if not self.threshold > 1.0:
            raise ValueError(f"algorithm.rollout_is_threshold={self.threshold} must be > 1")
        if self.threshold_lower is not None:
            if self.mode != "mask":
                raise ValueError(
                    "algorithm.rollout_is_threshold_lower is only used with algorithm.rollout_is_mode='mask'; "
                    "unset it for 'truncate'"
                )
            if not 0.0 < self.threshold_lower < 1.0:
                raise ValueError(f"algorithm.rollout_is_threshold_lower={self.threshold_lower} must lie in (0, 1)")

    @property
    def lower(self) -> float:
        """The lower bound mask mode uses."""
        return self.threshold_lower if self.threshold_lower is not None else 1.0 / self.threshold
