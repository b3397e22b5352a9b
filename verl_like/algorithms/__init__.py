"""RL algorithm core: advantage estimators, policy/value/KL losses, loss aggregation, KL control, DAPO helpers.

Pure tensor functions (CPU or GPU, any float dtype) chosen by name from registries; see docs/algorithms.md.
"""

from verl_like.algorithms.advantages import AdvantageConfig, AdvantageEstimator, AdvantageInputs, compute_advantage
from verl_like.algorithms.aggregation import LOSS_AGG_MODES, LossNormalizer, aggregate_loss
from verl_like.algorithms.dapo import (
    GroupFilterResult,
    add_to_last_valid_token,
    apply_overlong_penalty,
    filter_zero_variance_groups,
    overlong_reward_penalty,
)
from verl_like.algorithms.entropy import entropy_from_logits, entropy_from_logits_chunked
from verl_like.algorithms.kl import compute_kl_loss, kl_estimate
from verl_like.algorithms.kl_control import (
    AdaptiveKLController,
    FixedKLController,
    KLController,
    apply_kl_penalty,
    build_kl_controller,
)
from verl_like.algorithms.masked import group_ids, masked_mean, masked_sum, masked_whiten
from verl_like.algorithms.policy_loss import (
    ADVANTAGE_WEIGHTED_LOSSES,
    LossOutput,
    PolicyLossConfig,
    PolicyLossFn,
    PolicyLossInputs,
    compute_policy_loss,
)
from verl_like.algorithms.registry import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    get_advantage_estimator,
    get_kl_estimator,
    get_policy_loss,
    register_advantage_estimator,
    register_kl_estimator,
    register_policy_loss,
)
from verl_like.algorithms.rollout_is import RolloutISConfig, compute_rollout_is_weights
from verl_like.algorithms.value_loss import compute_value_loss

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "ADVANTAGE_WEIGHTED_LOSSES",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "AdvantageConfig",
    "AdvantageEstimator",
    "AdvantageInputs",
    "FixedKLController",
    "GroupFilterResult",
    "KLController",
    "LossNormalizer",
    "LossOutput",
    "PolicyLossConfig",
    "PolicyLossFn",
    "PolicyLossInputs",
    "RolloutISConfig",
    "add_to_last_valid_token",
    "aggregate_loss",
    "apply_kl_penalty",
    "apply_overlong_penalty",
    "build_kl_controller",
    "compute_advantage",
    "compute_kl_loss",
    "compute_policy_loss",
    "compute_rollout_is_weights",
    "compute_value_loss",
    "entropy_from_logits",
    "entropy_from_logits_chunked",
    "filter_zero_variance_groups",
    "get_advantage_estimator",
    "get_kl_estimator",
    "get_policy_loss",
    "group_ids",
    "kl_estimate",
    "masked_mean",
    "masked_sum",
    "masked_whiten",
    "overlong_reward_penalty",
    "register_advantage_estimator",
    "register_kl_estimator",
    "register_policy_loss",
]
