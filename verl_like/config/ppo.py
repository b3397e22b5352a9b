"""PPOConfig: the root of the config tree (the keys of configs/ppo_trainer.yaml), frozen."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from verl_like.config.algorithm import AlgorithmConfig
from verl_like.config.async_training import AsyncTrainingConfig
from verl_like.config.data import DataConfig
from verl_like.config.derived import DerivedSizes, derive_sizes
from verl_like.config.distillation import DistillationConfig
from verl_like.config.online_dpo import OnlineDPOConfig
from verl_like.config.placement import RolloutPlacement
from verl_like.config.pools import ResourcePoolConfig, RolePoolConfig
from verl_like.config.reward import CustomRewardFunctionConfig, RewardModelConfig
from verl_like.config.roles import ActorRolloutRefConfig, CriticRoleConfig
from verl_like.config.trainer import TrainerConfig


@dataclass(frozen=True)
class PPOConfig:
    """One RL job: every node mirrors verl's key of the same name (docs/config.md lists every key).

    data: DataConfig. actor_rollout_ref: ActorRolloutRefConfig (model, actor, rollout, ref).
    critic: CriticRoleConfig. reward_model: RewardModelConfig. custom_reward_function: CustomRewardFunctionConfig.
    algorithm: AlgorithmConfig. trainer: TrainerConfig. rollout_pool: ResourcePoolConfig (server mode's servers).
    async_training: AsyncTrainingConfig (generation overlapping the update).
    critic_pool / reward_model_pool: RolePoolConfig (a role on devices of its own; default colocated).
    online_dpo: OnlineDPOConfig (the online-DPO trainer).
    distillation: DistillationConfig (on-policy distillation from a teacher).
    `derived` and `placement` (not keys) hold the per-rank and per-step sizes and the rollout's placement
    computed from these.
    """

    data: DataConfig = field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    critic: CriticRoleConfig = field(default_factory=lambda: CriticRoleConfig(ppo_micro_batch_size_per_gpu=4))
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    rollout_pool: ResourcePoolConfig = field(default_factory=ResourcePoolConfig)
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    critic_pool: RolePoolConfig = field(default_factory=RolePoolConfig)
    reward_model_pool: RolePoolConfig = field(default_factory=RolePoolConfig)
    online_dpo: OnlineDPOConfig = field(default_factory=OnlineDPOConfig)
    distillation: DistillationConfig = field(default_factory=DistillationConfig)

    @functools.cached_property
    def derived(self) -> DerivedSizes:
        """Per-rank / per-step sizes, computed on first use (ConfigError if the sizes do not split evenly)."""
        return derive_sizes(self)

    @functools.cached_property
    def placement(self) -> RolloutPlacement:
        """Where the rollout runs (config/placement.py), decided once; never raises (validation reports misfits)."""
        return RolloutPlacement.of(self)
