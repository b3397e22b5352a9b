"""Placement and asynchronous-training keys: refused before anything starts, with the key and the fix named."""

from __future__ import annotations

import logging

import pytest

from verl_like.config.errors import ConfigError
from verl_like.config.loader import load_config

SERVER = "actor_rollout_ref.rollout.mode=server"
# One device shared by the trainer's worker and one server (the gpu_memory_utilization default 0.5 fits 0.5).
SHARED = ["trainer.n_gpus_per_node=1", "rollout_pool.gpu_fraction=0.5"]


# verl's async (servers on the trainer's own GPUs, asleep during the update) is refused on the command line:
# tests/unit/config/test_verl_example_commands.py.
@pytest.mark.parametrize("value, mode", [("colocate", "colocate"), ("server", "server"), ("sync", "colocate")])
def test_rollout_mode_accepts_ours_and_verls_names(value, mode):
    assert load_config([f"actor_rollout_ref.rollout.mode={value}"]).actor_rollout_ref.rollout.mode == mode


@pytest.mark.parametrize("overrides, message", [
    (["actor_rollout_ref.rollout.mode=servers"], r"actor_rollout_ref.rollout.mode='servers' is not one of"),
    ([SERVER, "actor_rollout_ref.rollout.name=hf"],
     r"mode=server needs a backend with servers.*set .*rollout.name=vllm"),
    ([SERVER, "actor_rollout_ref.rollout.server.address=[127.0.0.1:8000]"], r"must be a URL like http://"),
    ([SERVER, "actor_rollout_ref.rollout.server.pause_mode=wait"], r"server.pause_mode='wait' is not one of"),
    ([SERVER, "actor_rollout_ref.rollout.server.request_retries=-1"], r"server.request_retries=-1, .* must be >= 0"),
    ([SERVER, "actor_rollout_ref.rollout.server.max_restarts=-2"], r"server.max_restarts=-2 must be >= 0"),
    ([SERVER, "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "rollout_pool.n_gpus_per_node=3"],
     r"tensor_model_parallel_size=2 does not divide rollout_pool.n_gpus_per_node=3"),
    (["rollout_pool.nnodes=0"], r"rollout_pool.nnodes=0 .* must both be >= 1"),
    (["async_training.enable=true"], r"set actor_rollout_ref.rollout.mode=server"),
    (["async_training.staleness=1"], r"take effect only with async_training.enable=true"),
    ([SERVER, "async_training.enable=true", "async_training.partial_rollout=true"],
     r"partial_rollout=true needs async_training.staleness >= 1"),
    ([SERVER, "async_training.enable=true", "algorithm.filter_groups.enable=true"], r"turn one of them off"),
    (["rollout_pool.gpu_fraction=1.0"], r"rollout_pool.gpu_fraction=1.0 must be 0 .* or in \(0, 1\)"),
    (["rollout_pool.gpu_fraction=0.12345"], r"at most 4 decimals"),
    (["rollout_pool.gpu_fraction=0.5"], r"only actor_rollout_ref.rollout.mode=server starts"),
    ([SERVER, *SHARED, "actor_rollout_ref.rollout.server.address=[http://a:1]"], r"set one of them"),
    ([SERVER, *SHARED, "actor_rollout_ref.rollout.tensor_model_parallel_size=2"],
     r"tensor_model_parallel_size=2 must be 1"),
    ([SERVER, "rollout_pool.gpu_fraction=0.5", "actor_rollout_ref.rollout.gpu_memory_utilization=0.5"],
     r"rollout_pool.nnodes=1 x n_gpus_per_node=1 differs from trainer.nnodes=1 x n_gpus_per_node=2"),
    ([SERVER, *SHARED, "actor_rollout_ref.rollout.gpu_memory_utilization=0.6"],
     r"gpu_memory_utilization=0.6 exceeds rollout_pool.gpu_fraction=0.5.*set gpu_memory_utilization <= 0.5"),
    ([SERVER, "actor_rollout_ref.rollout.server.weight_transfer=nccl"], r"server.weight_transfer='nccl' is not one of"),
    ([SERVER, *SHARED, "trainer.device=cpu", "actor_rollout_ref.rollout.server.weight_transfer=ipc"],
     r"weight_transfer=ipc moves CUDA memory, but trainer.device=cpu"),
    ([SERVER, "trainer.device=cuda", "actor_rollout_ref.rollout.server.weight_transfer=ipc"],
     r"weight_transfer=ipc needs the servers on the trainer's GPU, but rollout_pool.gpu_fraction=0"),
    ([SERVER, "trainer.device=cuda", "rollout_pool.gpu_fraction=0.5", "rollout_pool.n_gpus_per_node=2",
      "actor_rollout_ref.rollout.server.weight_transfer=ipc"],
     r"with trainer.nnodes x n_gpus_per_node=2 devices the servers of the other devices sit on other GPUs"),
])
def test_bad_placement_and_async_settings_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides)


def test_server_mode_sizes_servers_by_the_rollout_pool_not_the_trainer_world():
    config = load_config([SERVER, "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "rollout_pool.nnodes=2",
                          "rollout_pool.n_gpus_per_node=4", "trainer.n_gpus_per_node=1",
                          "trainer.ray_init.num_cpus=8"])
    assert config.derived.rollout_dp_size == 4  # 2 nodes x 4 devices / TP 2; TP needs not divide the trainer's 1
    external = load_config([SERVER, "actor_rollout_ref.rollout.server.address=[http://a:1,http://b:2]"])
    assert external.derived.rollout_dp_size == 2


def test_staleness_without_importance_correction_warns(caplog):
    with caplog.at_level(logging.WARNING):
        load_config([SERVER, "async_training.enable=true", "async_training.staleness=1"])
    assert "set algorithm.rollout_is=true" in caplog.text


def test_stale_batches_train_the_actor_at_the_learning_rate_divided_by_their_lag():
    config = load_config([SERVER, "async_training.enable=true", "async_training.staleness=3",
                          "algorithm.rollout_is=true"]).async_training
    assert config.scale_lr_by_staleness  # the default
    assert [config.lr_scale(lag) for lag in range(4)] == [1.0, 1.0, 0.5, pytest.approx(1 / 3)]
    off = load_config([SERVER, "async_training.enable=true", "async_training.staleness=3",
                       "async_training.scale_lr_by_staleness=false"]).async_training
    assert [off.lr_scale(lag) for lag in range(4)] == [1.0] * 4
    with pytest.raises(ValueError, match="cannot lag -1 versions"):
        config.lr_scale(-1)


def test_a_critic_on_its_own_pool_splits_its_mini_batches_by_that_pool():
    config = load_config(["algorithm.adv_estimator=gae", "critic_pool.nnodes=1", "critic_pool.n_gpus_per_node=1"])
    assert config.derived.world_size == 2 and config.derived.use_critic
    # One critic process takes every sample of a mini-batch; the actor's two ranks take half each.
    assert config.derived.critic_ppo_mini_batch_size_per_rank == config.derived.critic_ppo_mini_batch_size_samples
    assert config.derived.ppo_mini_batch_size_per_rank * 2 == config.derived.ppo_mini_batch_size_samples
    with pytest.raises(ConfigError, match=r"both be >= 1 \(a pool of its own\) or both 0"):
        load_config(["critic_pool.nnodes=1"])


def test_servers_sharing_the_trainer_devices_are_one_per_device_and_take_no_slot():
    config = load_config([SERVER, *SHARED, "trainer.ray_init.num_cpus=1"])  # 1 CPU: the server needs no slot
    assert config.derived.rollout_dp_size == 1
    assert config.rollout_pool.shares_trainer_devices


def test_ipc_is_accepted_for_a_server_on_the_one_trainer_gpu_and_for_servers_at_an_address():
    ipc = ["trainer.device=cuda", "actor_rollout_ref.rollout.server.weight_transfer=ipc"]
    shared = load_config([SERVER, *SHARED, *ipc])
    assert shared.actor_rollout_ref.rollout.server.weight_transfer == "ipc"
    # The user's servers: the sender checks their GPU at connect; the config cannot.
    load_config([SERVER, "actor_rollout_ref.rollout.server.address=[http://127.0.0.1:8000]", *ipc])
