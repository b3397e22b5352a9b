"""EngineConfig of each trained or scored role, from its frozen config node (the workers call these).

Each `fsdp_config` node maps to the engine's dtype and memory fields in one place (`_fsdp_fields`).

    engine = build_engine(actor_engine_config(actor, model_path, total_training_steps=steps), actor.strategy,
                          actor.megatron)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from verl_like.config.actor import ActorConfig, FSDPConfig, PPOUpdateNode, configured_token_budget
from verl_like.config.critic import CriticConfig
from verl_like.config.errors import ConfigError
from verl_like.config.model import ModelConfig, RefConfig
from verl_like.config.reward import RewardModelConfig
from verl_like.config.rollout import RolloutConfig
from verl_like.config.roles import CriticRoleConfig
from verl_like.engine.config import EngineConfig, LoraSettings, MicroBatching


def _fsdp_fields(fsdp: FSDPConfig) -> dict[str, Any]:
    """The EngineConfig fields an `fsdp_config` node sets (optimizer_offload apart: only trained roles have it)."""
    return {
        "dtype": fsdp.model_dtype,
        "param_dtype": fsdp.param_dtype,
        "reduce_dtype": fsdp.reduce_dtype,
        "param_offload": fsdp.param_offload,
        "offload_policy": fsdp.offload_policy,
        "reshard_after_forward": fsdp.reshard_after_forward,
    }


def build_engine_config(
    node: PPOUpdateNode,
    model_kind: str,
    model_path: str,
    total_training_steps: int | None,
    seed: int,
    *,
    override_config: Mapping[str, Any] | None = None,
    trust_remote_code: bool = False,
    fused_kernels: bool = False,
    lora: LoraSettings | None = None,
) -> EngineConfig:
    """The EngineConfig of the actor or critic node; override_config / trust_remote_code come from the role's
    `model` node (actor_rollout_ref.model or critic.model), fused_kernels from the actor's node."""
    optim, fsdp = node.optim, node.fsdp_config
    if optim.lr_scheduler_type == "cosine" and total_training_steps is None:
        raise ValueError(
            f"{node.PREFIX}.optim.lr_scheduler_type='cosine' needs the run's number of optimizer steps; pass "
            "total_training_steps (the trainer computes it from the data size and epochs)"
        )
    return EngineConfig(
        model_path=model_path,
        model_kind=model_kind,
        gradient_checkpointing=node.gradient_checkpointing,
        fused_kernels=fused_kernels,
        override_config=override_config or {},
        trust_remote_code=trust_remote_code,
        lr=optim.lr,
        weight_decay=optim.weight_decay,
        betas=optim.betas,
        eps=optim.eps,
        lr_scheduler=optim.lr_scheduler_type,
        warmup_steps=optim.warmup_steps(total_training_steps, f"{node.PREFIX}.optim"),
        total_steps=total_training_steps,
        min_lr_ratio=optim.min_lr_ratio,
        grad_clip=node.grad_clip,
        # With dynamic batching the engine plans by tokens and never reads the row count; 1 satisfies its check.
        micro_batch_size_per_rank=node.ppo_micro_batch_size_per_gpu or 1,
        use_dynamic_bsz=node.use_dynamic_bsz,
        # A null (auto) budget starts at the fallback; the worker sizes it on CUDA (engine/token_budget.py).
        max_tokens_per_rank=configured_token_budget(node.ppo_max_token_len_per_gpu) if node.use_dynamic_bsz else None,
        use_remove_padding=node.use_remove_padding,
        optimizer_offload=fsdp.optimizer_offload,
        seed=seed,
        lora=lora,
        **_fsdp_fields(fsdp),
    )


def actor_engine_config(
    actor: ActorConfig,
    model_path: str,
    *,
    total_training_steps: int | None = None,
    seed: int = 0,
    override_config: Mapping[str, Any] | None = None,
    trust_remote_code: bool = False,
    lora: LoraSettings | None = None,
) -> EngineConfig:
    """The causal-LM EngineConfig of the actor (total_training_steps: needed by cosine and warmup ratio;
    override_config / trust_remote_code / lora: actor_rollout_ref.model's, see `lora_settings`)."""
    config = build_engine_config(
        actor, "causal_lm", model_path, total_training_steps, seed,
        # A null (auto) use_fused_kernels is decided on the driver (config/fused_kernels.py); one that reaches here
        # undecided comes from a config built by hand outside the trainer and stays off.
        override_config=override_config, trust_remote_code=trust_remote_code,
        fused_kernels=bool(actor.use_fused_kernels), lora=lora,
    )
    return dataclasses.replace(config, freeze_vision_tower=actor.freeze_vision_tower)


def lora_settings(model: ModelConfig | None) -> LoraSettings | None:
    """The LoRA adapter actor_rollout_ref.model asks for (lora_rank > 0), else None."""
    if model is None or not model.lora_enabled:
        return None
    return LoraSettings(rank=model.lora_rank, alpha=model.lora_alpha, target_modules=model.target_modules,
                        exclude_modules=model.exclude_modules, adapter_path=model.lora_adapter_path)


def critic_engine_config(
    critic: CriticConfig, model_path: str, *, total_training_steps: int | None = None, seed: int = 0
) -> EngineConfig:
    """The value-model EngineConfig of the critic (a causal-LM checkpoint gets a fresh value head from seed); the
    `critic` role node also brings critic.model.override_config and trust_remote_code."""
    model = critic.model if isinstance(critic, CriticRoleConfig) else None
    return build_engine_config(
        critic, "value", model_path, total_training_steps, seed,
        override_config=model.override_config if model is not None else None,
        trust_remote_code=model.trust_remote_code if model is not None else False,
    )


def reward_model_engine_config(reward_model: RewardModelConfig, seed: int = 0) -> EngineConfig:
    """The inference-only sequence-classifier EngineConfig of the reward model (needs reward_model.model.path)."""
    model = reward_model.model
    if not model.path:
        raise ConfigError("reward_model.model.path is unset; set it to a local reward-model directory")
    return EngineConfig(
        model_path=model.path,
        model_kind="sequence_classifier",
        micro_batch_size_per_rank=reward_model.micro_batch_size_per_gpu,
        use_dynamic_bsz=reward_model.use_dynamic_bsz,
        max_tokens_per_rank=reward_model.forward_max_token_len_per_gpu if reward_model.use_dynamic_bsz else None,
        use_remove_padding=model.use_remove_padding,
        trust_remote_code=model.trust_remote_code,
        inference_only=True,
        seed=seed,
        **_fsdp_fields(model.fsdp_config),
    )


def log_prob_micro_batching(rollout: RolloutConfig, actor_engine_config: EngineConfig,
                            sized_budget: int | None = None) -> MicroBatching:
    """How the actor's forward for old log-probs splits its rows: the rollout node's log_prob_* keys (verl's
    names), the actor's micro-batch size where log_prob_micro_batch_size_per_gpu is unset. sized_budget: the
    budget sized from free memory for a null log_prob_max_token_len_per_gpu (None: the fallback)."""
    size = rollout.log_prob_micro_batch_size_per_gpu or actor_engine_config.micro_batch_size_per_rank
    if not rollout.log_prob_use_dynamic_bsz:
        return MicroBatching(size)
    budget = rollout.log_prob_max_token_len_per_gpu
    return MicroBatching(size, configured_token_budget(sized_budget if budget is None else budget))


def reference_engine_config(actor_engine_config: EngineConfig, ref: RefConfig | None = None) -> EngineConfig:
    """The actor's EngineConfig for a forward-only model (same weights, no optimizer).

    Without `ref` it keeps the actor's dtypes and micro-batching; with the `actor_rollout_ref.ref` node, its
    log_prob_* micro-batch keys and its fsdp_config (dtypes, param_offload, reshard_after_forward) apply.
    """
    config = dataclasses.replace(actor_engine_config, inference_only=True, optimizer_offload=False)
    if ref is None:
        return config
    return dataclasses.replace(
        config,
        micro_batch_size_per_rank=ref.log_prob_micro_batch_size_per_gpu,
        use_dynamic_bsz=ref.log_prob_use_dynamic_bsz,
        max_tokens_per_rank=(configured_token_budget(ref.log_prob_max_token_len_per_gpu)
                             if ref.log_prob_use_dynamic_bsz else None),
        **_fsdp_fields(ref.fsdp_config),
    )
