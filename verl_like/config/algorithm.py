"""AlgorithmConfig: the `algorithm` node, with exactly the keys docs/algorithms.md documents."""

from __future__ import annotations

from dataclasses import dataclass, field

from verl_like.config.errors import ConfigError
from verl_like.config.loss_options import RolloutISConfig
from verl_like.config.names import ADVANTAGE_ESTIMATOR_NAMES, KL_CTRL_TYPES, KL_ESTIMATOR_NAMES


@dataclass(frozen=True)
class KLControlConfig:
    """`algorithm.kl_ctrl`: the coefficient of the KL-in-reward penalty.

    type: "fixed" (kl_coef stays) or "adaptive" (steers the measured KL towards target_kl over horizon samples).
    """

    type: str = "fixed"
    kl_coef: float = 0.001
    target_kl: float = 0.1
    horizon: int = 10000

    def __post_init__(self) -> None:
        if self.type not in KL_CTRL_TYPES:
            raise ConfigError(f"algorithm.kl_ctrl.type={self.type!r} must be one of {KL_CTRL_TYPES}")
        if not self.kl_coef >= 0:
            raise ConfigError(f"algorithm.kl_ctrl.kl_coef={self.kl_coef} must be >= 0")
        if self.type == "adaptive":
            for key in ("target_kl", "horizon"):
                if not getattr(self, key) > 0:
                    raise ConfigError(
                        f"algorithm.kl_ctrl.{key}={getattr(self, key)} must be > 0 for the adaptive controller"
                    )


# Per-sample values DAPO's dynamic sampling can compare (verl_like/trainer/ppo_trainer.py).
FILTER_METRICS = ("acc", "score")


@dataclass(frozen=True)
class FilterGroupsConfig:
    """`algorithm.filter_groups`: DAPO dynamic sampling.

    enable: drop groups whose `metric` is equal for all samples (zero advantage) and generate more batches until
      data.train_batch_size groups remain. metric: the per-sample value compared: "acc" (the rule or custom
      scorer's score alone) or "score" (the final score: rule + reward model + overlong penalty).
      max_num_gen_batches: the most generation rounds per step (>= 1); when still short the step fails with an
      error saying so (as verl's DAPO does).
    """

    enable: bool = False
    metric: str = "acc"
    max_num_gen_batches: int = 10

    def __post_init__(self) -> None:
        if self.metric not in FILTER_METRICS:
            raise ConfigError(
                f"algorithm.filter_groups.metric={self.metric!r} must be one of {FILTER_METRICS}: 'acc' compares "
                "the rule/custom scorer's score, 'score' the final score (with reward model and overlong penalty)"
            )
        if self.max_num_gen_batches < 1:
            raise ConfigError(
                f"algorithm.filter_groups.max_num_gen_batches={self.max_num_gen_batches} must be >= 1 "
                "(the number of generation rounds per step is bounded)"
            )


@dataclass(frozen=True)
class AlgorithmConfig:
    """How advantages and KL are computed (`algorithm`); docs/algorithms.md has every formula.

    adv_estimator: a registered advantage estimator (gae, grpo, rloo, reinforce_plus_plus,
      reinforce_plus_plus_baseline, remax, or a user's). gamma / lam: discount and GAE lambda, in [0, 1].
    norm_adv_by_std_in_grpo: GRPO divides by the group's std (false: Dr.GRPO).
    use_kl_in_reward / kl_penalty / kl_ctrl: KL to the reference subtracted from the reward with that estimator
      and coefficient controller.
    rollout_is, rollout_is_level, rollout_is_mode, rollout_is_threshold, rollout_is_threshold_lower:
      importance-sampling correction between the rollout engine's and the trainer's log-probs.
    filter_groups: DAPO dynamic sampling.
    """

    adv_estimator: str = "gae"
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    rollout_is: bool = False
    rollout_is_level: str = "token"
    rollout_is_mode: str = "truncate"
    rollout_is_threshold: float = 2.0
    rollout_is_threshold_lower: float | None = None
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)

    def __post_init__(self) -> None:
        ADVANTAGE_ESTIMATOR_NAMES.check("algorithm.adv_estimator", self.adv_estimator)
        KL_ESTIMATOR_NAMES.check("algorithm.kl_penalty", self.kl_penalty)
        for key in ("gamma", "lam"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ConfigError(f"algorithm.{key}={getattr(self, key)} must lie in [0, 1]")
        try:
            self.rollout_is_config()
        except ValueError as err:
            raise ConfigError(str(err)) from err

    def rollout_is_config(self) -> RolloutISConfig:
        """The RolloutISConfig of the `rollout_is_*` keys (used when `rollout_is` is true)."""
        return RolloutISConfig(
            level=self.rollout_is_level,
            mode=self.rollout_is_mode,
            threshold=self.rollout_is_threshold,
            threshold_lower=self.rollout_is_threshold_lower,
        )
