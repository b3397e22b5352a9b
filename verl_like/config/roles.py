"""Role nodes that group the per-part configs: `actor_rollout_ref` and `critic` (the value model's role)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from verl_like.config.actor import ActorConfig
from verl_like.config.critic import CriticConfig
from verl_like.config.errors import ConfigError
from verl_like.config.model import ModelConfig, RefConfig
from verl_like.config.rollout import RolloutConfig


@dataclass(frozen=True)
class ActorRolloutRefConfig:
    """`actor_rollout_ref`: the policy model, its PPO update, its rollout engine and the reference copy.

    hybrid_engine: actor, rollout and reference share one process per GPU (weights resharded from FSDP into the
      rollout engine after each update). It is the only layout verl_like runs; false is rejected.
    """

    hybrid_engine: bool = True
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=lambda: ActorConfig(ppo_micro_batch_size_per_gpu=4))
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    ref: RefConfig = field(default_factory=RefConfig)

    def __post_init__(self) -> None:
        if not self.hybrid_engine:
            raise ConfigError(
                "actor_rollout_ref.hybrid_engine=false (rollout on its own workers) is not supported; "
                "set actor_rollout_ref.hybrid_engine=true"
            )
        actor, ref = self.actor, self.ref
        if ref.strategy is not None and ref.strategy != actor.strategy:
            raise ConfigError(
                f"actor_rollout_ref.ref.strategy={ref.strategy} differs from actor_rollout_ref.actor.strategy="
                f"{actor.strategy}; the reference follows the actor's engine: remove actor_rollout_ref.ref.strategy"
            )
        # The reference's unset engine keys take the actor's, once, here (the node stays frozen afterwards).
        resolved = dataclasses.replace(ref, strategy=actor.strategy, megatron=ref.megatron or actor.megatron)
        object.__setattr__(self, "ref", resolved)


@dataclass(frozen=True)
class CriticModelConfig:
    """`critic.model`: the value model, a causal-LM checkpoint that gets a fresh value head.

    path: local HF directory or "tiny"; null uses actor_rollout_ref.model.path.
    tokenizer_path: the critic reads the actor's token ids, so this (else a path other than the actor's) must
      hold the policy's tokenizer; validation compares them (null: nothing to compare beyond path).
    override_config / trust_remote_code / enable_gradient_checkpointing / use_remove_padding: as for
    actor_rollout_ref.model (the YAML feeds the last two to critic.gradient_checkpointing / use_remove_padding).
    lora_rank / lora_alpha / target_modules: verl's critic LoRA keys; lora_rank > 0 is refused (config/lora.py
      says why), 0 trains every weight.
    """

    path: str | None = None
    tokenizer_path: str | None = None
    trust_remote_code: bool = False
    override_config: Mapping[str, Any] = field(default_factory=dict)
    enable_gradient_checkpointing: bool = False
    use_remove_padding: bool = False
    lora_rank: int = 0
    lora_alpha: int = 16
    target_modules: str | tuple[str, ...] = "all-linear"


@dataclass(frozen=True)
class CriticRoleConfig(CriticConfig):
    """`critic`: CriticConfig (the value update) plus whether the role runs and which model it trains.

    enable: true / false forces the critic on / off; null turns it on exactly when algorithm.adv_estimator needs
      values (gae). model: CriticModelConfig.
    """

    enable: bool | None = None
    model: CriticModelConfig = field(default_factory=CriticModelConfig)

    def model_path(self, actor_model: ModelConfig) -> str:
        """The critic's model path (the policy's when critic.model.path is null)."""
        return self.model.path or actor_model.path
