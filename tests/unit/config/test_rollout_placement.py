"""RolloutPlacement: each placement kind and its sizes from a config, the Ray resources of a started server
(rollout_pool.gpu_fraction splits a trainer bundle exactly) and the weight-transfer engine auto resolves to.

Only the numbers; no Ray, no device."""

from __future__ import annotations

import dataclasses

import pytest

from verl_like.config.errors import ConfigError
from verl_like.config.loader import load_config
from verl_like.config.placement import PlacementKind, RolloutPlacement
from verl_like.config.pools import ResourcePoolConfig

SERVER = "actor_rollout_ref.rollout.mode=server"
ONE_GPU = ["trainer.n_gpus_per_node=1", "trainer.ray_init.num_cpus=null"]
USER = "actor_rollout_ref.rollout.server.address=[http://127.0.0.1:8000,http://127.0.0.1:8001]"


def test_colocated_is_the_default_and_has_no_servers():
    placement = load_config([]).placement
    assert placement.kind is PlacementKind.COLOCATED
    assert not placement.uses_servers and not placement.starts_servers and not placement.servers_start_early
    assert (placement.servers, placement.pool_devices, placement.trainer_fraction) == (0, 0, 1.0)
    assert placement.describe() is None


def test_servers_on_their_own_pool_are_one_per_tp_devices_and_start_early():
    config = load_config([SERVER, "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "rollout_pool.nnodes=2",
                          "rollout_pool.n_gpus_per_node=4", "trainer.ray_init.num_cpus=16"])
    placement = config.placement
    assert placement.kind is PlacementKind.OWN_POOL and placement.starts_servers and placement.servers_start_early
    assert (placement.servers, placement.nnodes, placement.servers_per_node, placement.pool_devices) == (4, 2, 2, 8)
    assert config.derived.rollout_dp_size == 4 and placement.trainer_fraction == 1.0
    assert placement.server_resources("cuda", 2.0) == {"num_gpus": 2.0, "num_cpus": 2.0}  # TP=2 devices each
    assert placement.describe() == "4 vLLM server(s) on rollout_pool (8 devices)"


def test_servers_on_the_trainer_devices_take_no_pool_and_wait_for_the_trainer():
    config = load_config([SERVER, *ONE_GPU, "rollout_pool.gpu_fraction=0.5"])
    placement = config.placement
    assert placement.kind is PlacementKind.TRAINER_DEVICES and placement.shares_trainer_devices
    assert placement.starts_servers and not placement.servers_start_early
    assert (placement.servers, placement.pool_devices, placement.gpu_fraction) == (1, 0, 0.5)
    assert config.derived.rollout_dp_size == 1


def test_the_users_servers_are_counted_by_address_and_never_started():
    config = load_config([SERVER, USER])
    placement = config.placement
    assert placement.kind is PlacementKind.USER_SERVERS and placement.uses_servers and not placement.starts_servers
    assert placement.servers == 2 and len(placement.addresses) == 2 and config.derived.rollout_dp_size == 2
    assert placement.trainer_fraction == 1.0 and placement.describe() is None


def test_the_placement_is_computed_once_per_config():
    config = load_config([SERVER])
    assert config.placement is config.placement


def test_colocated_and_cpu_resources_are_unchanged_by_default():
    on_cpu = load_config([SERVER]).placement
    assert on_cpu.server_resources("cpu", 1.0) == {"num_gpus": 0.0, "num_cpus": 1.0} and on_cpu.trainer_fraction == 1.0


@pytest.mark.parametrize("fraction", [0.5, 0.3, 0.3333, 0.1])
def test_a_shared_gpu_splits_each_trainer_bundle_exactly(fraction):
    config = load_config([SERVER, *ONE_GPU, f"rollout_pool.gpu_fraction={fraction}",
                          f"actor_rollout_ref.rollout.gpu_memory_utilization={fraction}"])
    placement = config.placement
    for cpus in (1.0, 3.0):
        resources = placement.server_resources("cuda", cpus)
        assert resources["num_gpus"] == fraction
        # Ray keeps 4 decimals: server + trainer must be the bundle, not a hair over it.
        assert round(resources["num_gpus"] + placement.trainer_fraction, 4) == 1.0
        assert round(resources["num_cpus"] + cpus * placement.trainer_fraction, 4) <= cpus


def test_a_shared_placement_on_cpu_splits_only_the_cpus():
    config = load_config([SERVER, *ONE_GPU, "rollout_pool.gpu_fraction=0.25",
                          "actor_rollout_ref.rollout.gpu_memory_utilization=0.25"])
    placement = config.placement
    assert placement.server_resources("cpu", 2.0) == {"num_gpus": 0.0, "num_cpus": 0.5}
    assert placement.trainer_fraction == 0.75


def test_auto_weight_transfer_is_ipc_only_for_started_servers_on_the_one_cuda_device():
    shared = load_config([SERVER, *ONE_GPU, "rollout_pool.gpu_fraction=0.5"]).placement
    assert shared.weight_transfer("cuda") == "ipc"
    assert shared.weight_transfer("cpu") == "gloo"  # no CUDA memory to share
    own_pool = load_config([SERVER, *ONE_GPU]).placement
    assert own_pool.weight_transfer("cuda") == "gloo"  # servers on GPUs of their own
    external = load_config([SERVER, *ONE_GPU, "actor_rollout_ref.rollout.server.address=[http://127.0.0.1:8000]"])
    assert external.placement.weight_transfer("cuda") == "gloo"  # the user's servers keep gloo unless set
    two_devices = load_config([SERVER, "trainer.n_gpus_per_node=2", "rollout_pool.n_gpus_per_node=2",
                               "rollout_pool.gpu_fraction=0.5", "trainer.ray_init.num_cpus=null"])
    assert two_devices.placement.weight_transfer("cuda") == "gloo"  # server 1 is not on rank 0's GPU


def test_an_explicit_weight_transfer_stands():
    gloo = load_config([SERVER, *ONE_GPU, "rollout_pool.gpu_fraction=0.5",
                        "actor_rollout_ref.rollout.server.weight_transfer=gloo"])
    assert gloo.placement.weight_transfer("cuda") == "gloo"
    external = load_config([SERVER, *ONE_GPU, "actor_rollout_ref.rollout.server.address=[http://127.0.0.1:8000]",
                            "actor_rollout_ref.rollout.server.weight_transfer=ipc", "trainer.device=cuda"])
    assert external.placement.weight_transfer("cuda") == "ipc"


@pytest.mark.parametrize("overrides, message", [
    # a fraction only places servers the trainer starts
    (["rollout_pool.gpu_fraction=0.5"], r"only actor_rollout_ref.rollout.mode=server starts"),
    ([SERVER, *ONE_GPU, "rollout_pool.gpu_fraction=0.5", USER], r"set one of them"),
    # started servers' TP ranks sit on one node
    ([SERVER, "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "rollout_pool.n_gpus_per_node=3"],
     r"tensor_model_parallel_size=2 does not divide rollout_pool.n_gpus_per_node=3"),
    # ipc needs the servers on rank 0's GPU
    ([SERVER, "trainer.device=cuda", "actor_rollout_ref.rollout.server.weight_transfer=ipc"],
     r"rollout_pool.gpu_fraction=0 gives them devices of their own"),
])
def test_a_placement_that_does_not_fit_is_refused_naming_the_keys(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides)


def test_the_placement_itself_never_raises_so_validation_can_report_every_misfit():
    config = load_config([SERVER])
    rollout = dataclasses.replace(config.actor_rollout_ref.rollout, tensor_model_parallel_size=2)
    odd = dataclasses.replace(config, rollout_pool=ResourcePoolConfig(n_gpus_per_node=3),
                              actor_rollout_ref=dataclasses.replace(config.actor_rollout_ref, rollout=rollout))
    assert RolloutPlacement.of(odd).kind is PlacementKind.OWN_POOL  # the TP error comes from validation
