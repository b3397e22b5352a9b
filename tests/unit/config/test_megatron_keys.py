"""The `*.strategy` and `*.megatron` keys: accepted values, the reference following the actor, the checks that need
the role's world or the model's shape, and the settings a megatron role refuses."""

from __future__ import annotations

import pytest

from verl_like.config import ConfigError, load_config
from verl_like.config.verl_compat import translate_overrides

A = "actor_rollout_ref.actor"
MEGATRON = [f"{A}.strategy=megatron"]
# 4 workers; a mini-batch is 1 prompt x 2 samples = 2 samples.
FOUR_WORKERS = ["trainer.n_gpus_per_node=4", "data.train_batch_size=2", f"{A}.ppo_mini_batch_size=1",
                f"{A}.ppo_micro_batch_size_per_gpu=1", "actor_rollout_ref.rollout.n=2"]


def _load(*overrides: str, check_paths: bool = False):
    return load_config(list(overrides), check_paths=check_paths)


def test_verl_fsdp_reads_as_fsdp2_and_the_keys_reach_the_config():
    config = _load(f"{A}.strategy=fsdp", "critic.strategy=fsdp", "reward_model.strategy=fsdp")
    assert config.actor_rollout_ref.actor.strategy == "fsdp2" and config.critic.strategy == "fsdp2"
    assert config.reward_model.strategy == "fsdp2" and config.actor_rollout_ref.ref.strategy == "fsdp2"
    out, _ = translate_overrides([f"{A}.strategy=megatron", "critic.strategy=fsdp"])
    assert out == [f"{A}.strategy=megatron", "critic.strategy=fsdp"]  # real keys now, passed on unchanged


def test_the_reference_follows_the_actor_key_by_key():
    config = _load(*MEGATRON, "trainer.n_gpus_per_node=4", f"{A}.megatron.tensor_model_parallel_size=2",
                   "actor_rollout_ref.ref.megatron.seed=7")
    ref = config.actor_rollout_ref.ref
    assert ref.strategy == "megatron"
    assert ref.megatron.tensor_model_parallel_size == 2 and ref.megatron.seed == 7
    assert config.actor_rollout_ref.actor.megatron.seed == 42


@pytest.mark.parametrize("overrides, message", [
    (["actor_rollout_ref.ref.strategy=megatron"], "actor_rollout_ref.ref.strategy=megatron differs"),
    (["reward_model.strategy=megatron"], "reward models run on FSDP"),
    (["critic.strategy=deepspeed"], "critic.strategy='deepspeed' is not a training strategy"),
    ([*MEGATRON, f"{A}.megatron.sequence_parallel=true"], f"{A}.megatron.sequence_parallel=true needs"),
    ([*MEGATRON, f"{A}.fsdp_config.reshard_after_forward=false"], f"{A}.fsdp_config.reshard_after_forward=false"),
    ([*MEGATRON, "actor_rollout_ref.model.use_remove_padding=true"], f"{A}.use_remove_padding=true is not"),
    ([*MEGATRON, "actor_rollout_ref.ref.fsdp_config.offload_policy=true"],
     "actor_rollout_ref.ref.fsdp_config.offload_policy=true is an FSDP setting"),
    ([*MEGATRON, f"{A}.fsdp_config.model_dtype=bf16"], f"{A}.fsdp_config.model_dtype=bfloat16 is not supported"),
    ([*MEGATRON, "trainer.device=cpu", f"{A}.fsdp_config.param_dtype=bf16"], "needs CUDA"),
    ([*MEGATRON, f"{A}.megatron.use_distributed_optimizer=true", "trainer.save_freq=5"],
     f"{A}.megatron.use_distributed_optimizer=true cannot be checkpointed yet"),
    ([*MEGATRON, "actor_rollout_ref.model.enable_gradient_checkpointing=true"],
     "enable_gradient_checkpointing=false"),
    ([*MEGATRON, "trainer.n_gpus_per_node=2", f"{A}.megatron.tensor_model_parallel_size=2",
      f"{A}.megatron.sequence_parallel=true"], f"{A}.megatron.sequence_parallel=true is not supported"),
])
def test_settings_a_megatron_role_cannot_honour_are_refused_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        _load(*overrides)


def test_verl_megatron_offload_keys_are_the_roles_offload_switches_the_megatron_engine_honours():
    config = _load(*MEGATRON, f"{A}.megatron.param_offload=True", f"{A}.megatron.optimizer_offload=True",
                   f"{A}.megatron.grad_offload=True", "actor_rollout_ref.ref.megatron.param_offload=True",
                   "critic.strategy=megatron", "critic.megatron.optimizer_offload=True")
    actor = config.actor_rollout_ref.actor.fsdp_config
    assert actor.param_offload and actor.optimizer_offload
    assert config.actor_rollout_ref.ref.fsdp_config.param_offload and config.critic.fsdp_config.optimizer_offload


def test_fsdp_settings_stay_free_under_fsdp2():
    config = _load(f"{A}.fsdp_config.param_offload=true", "actor_rollout_ref.model.use_remove_padding=true")
    assert config.actor_rollout_ref.actor.fsdp_config.param_offload


def test_batch_sizes_divide_by_the_megatron_dp_size_not_the_world():
    with pytest.raises(ConfigError, match="not divisible by the data-parallel size 4"):
        _load(*FOUR_WORKERS)  # fsdp2: 2 samples over 4 DP ranks
    config = _load(*FOUR_WORKERS, *MEGATRON, f"{A}.megatron.tensor_model_parallel_size=2")
    derived = config.derived
    assert (derived.world_size, derived.actor_dp_size, derived.ppo_mini_batch_size_per_rank) == (4, 2, 1)
    assert derived.topology.actor.tp_size == 2 and derived.topology.ref is None


def test_micro_batches_count_per_dp_rank():
    base = ["trainer.n_gpus_per_node=4", "data.train_batch_size=2", f"{A}.ppo_mini_batch_size=1",
            "actor_rollout_ref.rollout.n=8", f"{A}.ppo_micro_batch_size_per_gpu=4"]
    with pytest.raises(ConfigError, match="each rank gets 2 samples per mini-batch"):
        _load(*base)
    config = _load(*base, *MEGATRON, f"{A}.megatron.pipeline_model_parallel_size=2")
    assert config.derived.micro_batches_per_mini_batch == 1 and config.derived.actor_dp_size == 2


def test_model_parallel_sizes_must_divide_the_roles_world():
    with pytest.raises(ConfigError, match=rf"{A}.megatron: tensor_model_parallel_size=3 .* 2 workers"):
        _load(*MEGATRON, f"{A}.megatron.tensor_model_parallel_size=3")
    with pytest.raises(ConfigError, match=r"critic.megatron: tensor_model_parallel_size=2 .* 3 workers"):
        _load("critic.enable=true", "critic.strategy=megatron", "critic.megatron.tensor_model_parallel_size=2",
              "critic_pool.nnodes=1", "trainer.ray_init.num_cpus=null", "critic_pool.n_gpus_per_node=3", "critic.ppo_micro_batch_size_per_gpu=1", "data.train_batch_size=3",
              f"{A}.ppo_mini_batch_size=3", "actor_rollout_ref.rollout.n=2")


def test_a_critic_on_its_own_pool_splits_its_batches_over_its_own_dp_ranks():
    config = _load("critic.enable=true", "critic.strategy=megatron", "critic.megatron.tensor_model_parallel_size=2",
                   "critic_pool.nnodes=1", "trainer.ray_init.num_cpus=null", "critic_pool.n_gpus_per_node=4")
    critic = config.derived.topology.critic
    assert (critic.world_size, critic.dp_size, config.derived.critic_dp_size) == (4, 2, 2)
    assert config.derived.critic_ppo_mini_batch_size_per_rank == config.derived.critic_ppo_mini_batch_size_samples // 2


@pytest.mark.parametrize("overrides, message", [
    ([f"{A}.megatron.tensor_model_parallel_size=4", "trainer.n_gpus_per_node=4"],
     "tensor_model_parallel_size=4 does not divide the model's 2 key/value heads"),
    ([f"{A}.megatron.pipeline_model_parallel_size=4", "trainer.n_gpus_per_node=4"],
     "2 layers do not split into pipeline_model_parallel_size=4"),
    ([f"{A}.megatron.pipeline_model_parallel_size=2", f"{A}.megatron.virtual_pipeline_model_parallel_size=3",
      "+actor_rollout_ref.model.tiny_spec.num_hidden_layers=4"], "4 layers do not split"),
])
def test_the_layout_must_split_the_model(overrides, message):
    with pytest.raises(ConfigError, match=message):
        _load(*MEGATRON, *overrides)


def test_an_interleaved_pipeline_that_splits_the_layers_passes():
    config = _load(*MEGATRON, f"{A}.megatron.pipeline_model_parallel_size=2",
                   f"{A}.megatron.virtual_pipeline_model_parallel_size=2",
                   "+actor_rollout_ref.model.tiny_spec.num_hidden_layers=4")
    assert config.derived.topology.actor.pp_size == 2
