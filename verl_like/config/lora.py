"""What a LoRA run (actor_rollout_ref.model.lora_rank > 0) cannot do here, refused before Ray with the reason."""

from __future__ import annotations

from typing import TYPE_CHECKING

from verl_like.config.errors import ConfigError
from verl_like.config.rollout_backends import rollout_backend

if TYPE_CHECKING:
    from verl_like.config.ppo import PPOConfig

_M = "actor_rollout_ref.model"


def check_lora(config: PPOConfig) -> None:
    """Raises ConfigError for a LoRA setting this build does not run, naming the key and the way out."""
    critic_rank = config.critic.model.lora_rank
    if critic_rank:
        raise ConfigError(
            f"critic.model.lora_rank={critic_rank}: the critic trains every weight here (a LoRA critic would need "
            "its fresh value head trained beside the adapter, PEFT's modules_to_save, and no test covers it yet); "
            "set critic.model.lora_rank=0"
        )
    model = config.actor_rollout_ref.model
    if not model.lora_enabled:
        return
    arr = config.actor_rollout_ref
    if arr.actor.strategy == "megatron":
        raise ConfigError(
            f"{_M}.lora_rank={model.lora_rank} with actor_rollout_ref.actor.strategy=megatron: the Megatron engine "
            "builds no adapters (megatron-core 0.16 / 0.19 ship no PEFT-compatible LoRA layers; verl takes them from "
            "Megatron-Bridge, which is not a dependency here). Use actor_rollout_ref.actor.strategy=fsdp2, or "
            f"{_M}.lora_rank=0"
        )
    backend = rollout_backend(arr.rollout.name)
    if not model.lora.merge and backend.max_lora_rank is not None and model.lora_rank > backend.max_lora_rank:
        raise ConfigError(
            f"{_M}.lora_rank={model.lora_rank} exceeds {backend.label}'s largest max_lora_rank "
            f"{backend.max_lora_rank}; lower it, or serve merged weights with {_M}.lora.merge=true"
        )
    if config.placement.uses_servers and not model.lora.merge and not backend.server_adapters:
        raise ConfigError(
            f"{_M}.lora_rank={model.lora_rank} with actor_rollout_ref.rollout.mode=server: {backend.label}'s servers "
            f"take no adapters over HTTP (config/rollout_backends.py); serve the merged policy with "
            f"{_M}.lora.merge=true, or use rollout.mode=colocate"
        )
    if config.placement.uses_servers and not model.lora.merge and config.async_training.partial_rollout:
        raise ConfigError(
            f"{_M}.lora_rank={model.lora_rank} with actor_rollout_ref.rollout.mode=server and "
            "async_training.partial_rollout=true: a request frozen across a sync keeps the adapter it started with "
            "(vLLM fixes a request's adapter), so its later tokens would not come from the new version; serve the "
            f"merged policy with {_M}.lora.merge=true, or set async_training.partial_rollout=false"
        )
