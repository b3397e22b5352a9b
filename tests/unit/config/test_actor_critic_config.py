"""ActorConfig / CriticConfig: validation names the key, defaults resolve, conversion into EngineConfig."""

from __future__ import annotations

import pytest

from verl_like.config.actor import ActorConfig, FSDPConfig, OptimConfig, PolicyLossOptions
from verl_like.config.critic import CriticConfig
from verl_like.engine.from_config import actor_engine_config, critic_engine_config

ACTOR = "actor_rollout_ref.actor"


def _actor(**overrides) -> ActorConfig:
    return ActorConfig(**{"ppo_micro_batch_size_per_gpu": 2, **overrides})


def _critic(**overrides) -> CriticConfig:
    return CriticConfig(**{"ppo_micro_batch_size_per_gpu": 2, **overrides})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"ppo_mini_batch_size": 0}, f"{ACTOR}.ppo_mini_batch_size=0"),
        ({"ppo_micro_batch_size_per_gpu": None}, f"{ACTOR}.use_dynamic_bsz=true"),
        ({"ppo_micro_batch_size_per_gpu": 0}, f"{ACTOR}.ppo_micro_batch_size_per_gpu=0"),
        ({"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 0}, f"{ACTOR}.ppo_max_token_len_per_gpu=0"),
        ({"ppo_epochs": 0}, f"{ACTOR}.ppo_epochs=0"),
        ({"grad_clip": 0.0}, f"{ACTOR}.grad_clip=0.0"),
        ({"loss_agg_mode": "mean"}, f"{ACTOR}.loss_agg_mode='mean'"),
        ({"loss_scale_factor": 8.0}, f"{ACTOR}.loss_scale_factor is only used"),
        ({"loss_agg_mode": "seq-mean-token-sum-norm", "loss_scale_factor": -1.0}, f"{ACTOR}.loss_scale_factor=-1.0"),
        ({"kl_loss_type": "k9"}, f"{ACTOR}.kl_loss_type='k9'"),
        ({"kl_loss_coef": -0.1}, f"{ACTOR}.kl_loss_coef=-0.1"),
        ({"clip_ratio": -0.1}, f"{ACTOR}.clip_ratio=-0.1"),
        ({"clip_ratio_low": 1.0}, "clip_ratio_low=1.0"),
        ({"clip_ratio_c": 1.0}, "clip_ratio_c=1.0"),
        ({"optim": OptimConfig(lr=-1.0)}, f"{ACTOR}.optim.lr=-1.0"),
        ({"optim": OptimConfig(weight_decay=-1.0)}, f"{ACTOR}.optim.weight_decay=-1.0"),
        ({"optim": OptimConfig(betas=(0.9, 1.0))}, f"{ACTOR}.optim.betas=[0.9, 1.0]"),
        ({"optim": OptimConfig(eps=0.0)}, f"{ACTOR}.optim.eps=0.0"),
        ({"optim": OptimConfig(lr_warmup_steps_ratio=1.0)}, f"{ACTOR}.optim.lr_warmup_steps_ratio=1.0"),
        ({"optim": OptimConfig(lr_scheduler_type="linear")}, f"{ACTOR}.optim.lr_scheduler_type='linear'"),
        ({"optim": OptimConfig(min_lr_ratio=2.0)}, f"{ACTOR}.optim.min_lr_ratio=2.0"),
        ({"fsdp_config": FSDPConfig(model_dtype="fp16")}, f"{ACTOR}.fsdp_config.model_dtype='fp16'"),
        ({"fsdp_config": FSDPConfig(param_dtype="half")}, f"{ACTOR}.fsdp_config.param_dtype='half'"),
        ({"fsdp_config": FSDPConfig(reduce_dtype="fp8")}, f"{ACTOR}.fsdp_config.reduce_dtype='fp8'"),
    ],
)
def test_actor_config_rejects_bad_values_naming_the_key(overrides, message):
    with pytest.raises(ValueError) as excinfo:
        _actor(**overrides)
    assert message in str(excinfo.value)


def test_unknown_policy_loss_names_the_key_and_the_choices():
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.policy_loss\.loss_mode='ppo2'.*vanilla"):
        PolicyLossOptions(loss_mode="ppo2")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"ppo_mini_batch_size": -4}, "critic.ppo_mini_batch_size=-4"),
        ({"ppo_micro_batch_size_per_gpu": None}, "critic.use_dynamic_bsz=true"),
        ({"ppo_epochs": 0}, "critic.ppo_epochs=0"),
        ({"cliprange_value": 0.0}, "critic.cliprange_value=0.0"),
        ({"loss_agg_mode": "sum"}, "critic.loss_agg_mode='sum'"),
        ({"grad_clip": -1.0}, "critic.grad_clip=-1.0"),
        ({"optim": OptimConfig(lr=-1e-5)}, "critic.optim.lr=-1e-05"),
        ({"fsdp_config": FSDPConfig(model_dtype="int8")}, "critic.fsdp_config.model_dtype='int8'"),
    ],
)
def test_critic_config_rejects_bad_values_naming_the_key(overrides, message):
    with pytest.raises(ValueError) as excinfo:
        _critic(**overrides)
    assert message in str(excinfo.value)


def test_clip_ratio_is_the_fallback_of_low_and_high():
    assert _actor(clip_ratio=0.1).policy_loss_config().clip_ratio_low == 0.1
    assert _actor(clip_ratio=0.1).policy_loss_config().clip_ratio_high == 0.1
    resolved = _actor(clip_ratio=0.1, clip_ratio_high=0.28, clip_ratio_c=None).policy_loss_config()
    assert (resolved.clip_ratio_low, resolved.clip_ratio_high, resolved.clip_ratio_c) == (0.1, 0.28, None)


@pytest.mark.parametrize("config", [_actor(ppo_mini_batch_size=6), _critic(ppo_mini_batch_size=6)])
def test_mini_batch_per_rank_counts_prompts_times_n_or_names_the_key(config):
    assert config.mini_batch_size_per_rank(3, 1) == 2
    assert config.mini_batch_size_per_rank(4, 2) == 3  # 6 prompts x 2 samples over 4 ranks
    with pytest.raises(ValueError, match=rf"{config.PREFIX}\.ppo_mini_batch_size=6 prompts x rollout.n=2 = 12 "
                                         r"samples is not divisible by the data-parallel size 5"):
        config.mini_batch_size_per_rank(5, 2)
    with pytest.raises(ValueError, match=r"rollout_n=0"):
        config.mini_batch_size_per_rank(2, 0)


def test_actor_engine_config_carries_every_setting():
    config = _actor(
        ppo_micro_batch_size_per_gpu=3,
        grad_clip=None,
        use_remove_padding=True,
        gradient_checkpointing=True,
        optim=OptimConfig(lr=2e-5, weight_decay=0.1, betas=[0.8, 0.9], eps=1e-6, lr_warmup_steps=3,
                          lr_scheduler_type="cosine", min_lr_ratio=0.2),
        fsdp_config=FSDPConfig(model_dtype="fp32", param_dtype="bf16", reduce_dtype="fp32", param_offload=True,
                               optimizer_offload=True, offload_policy=True, reshard_after_forward=False),
    )
    engine = actor_engine_config(config, "/models/tiny", total_training_steps=20, seed=7)
    assert engine.model_kind == "causal_lm"
    assert (engine.model_path, engine.seed) == ("/models/tiny", 7)
    assert (engine.lr, engine.weight_decay, engine.betas, engine.eps) == (2e-5, 0.1, (0.8, 0.9), 1e-6)
    assert (engine.lr_scheduler, engine.warmup_steps, engine.total_steps, engine.min_lr_ratio) == ("cosine", 3, 20, 0.2)
    assert (engine.dtype, engine.param_dtype, engine.reduce_dtype) == ("float32", "bfloat16", "float32")
    assert (engine.param_offload, engine.optimizer_offload, engine.reshard_after_forward) == (True, True, False)
    assert engine.offload_policy
    assert (engine.use_remove_padding, engine.gradient_checkpointing, engine.grad_clip) == (True, True, None)
    assert (engine.micro_batch_size_per_rank, engine.use_dynamic_bsz, engine.max_tokens_per_rank) == (3, False, None)


def test_dynamic_batching_passes_the_token_budget():
    engine = _actor(ppo_micro_batch_size_per_gpu=None, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=96)
    converted = actor_engine_config(engine, "/m")
    assert (converted.use_dynamic_bsz, converted.max_tokens_per_rank) == (True, 96)


def test_warmup_ratio_needs_and_uses_total_steps():
    config = _actor(optim=OptimConfig(lr_warmup_steps_ratio=0.25))
    assert actor_engine_config(config, "/m", total_training_steps=40).warmup_steps == 10
    with pytest.raises(ValueError, match=rf"{ACTOR}\.optim\.lr_warmup_steps_ratio=0.25 .*total_training_steps"):
        actor_engine_config(config, "/m")
    explicit = _actor(optim=OptimConfig(lr_warmup_steps=5, lr_warmup_steps_ratio=0.25))
    assert actor_engine_config(explicit, "/m", total_training_steps=40).warmup_steps == 5  # explicit steps win


def test_cosine_needs_total_steps_naming_the_key():
    with pytest.raises(ValueError, match=r"critic\.optim\.lr_scheduler_type='cosine'.*total_training_steps"):
        critic_engine_config(_critic(optim=OptimConfig(lr_scheduler_type="cosine")), "/m")


def test_critic_engine_config_is_a_value_model():
    engine = critic_engine_config(_critic(cliprange_value=None, fsdp_config=FSDPConfig(model_dtype="bf16")), "/m")
    assert (engine.model_kind, engine.dtype, engine.lr) == ("value", "bfloat16", 1e-5)


def test_configs_are_frozen():
    config = _actor()
    with pytest.raises(AttributeError):
        config.ppo_epochs = 2  # type: ignore[misc]
