"""Server placement arithmetic: servers on devices of their own, or sharing the trainer's (rollout_pool.gpu_fraction).

Only the numbers Ray is asked for; no Ray, no device."""

from __future__ import annotations

import pytest

from verl_like.config.loader import load_config
from verl_like.trainer.server_placement import server_placement, server_weight_transfer

SERVER = "actor_rollout_ref.rollout.mode=server"
ONE_GPU = ["trainer.n_gpus_per_node=1", "trainer.ray_init.num_cpus=null"]


def test_servers_on_their_own_pool_take_whole_bundles_and_leave_the_trainer_whole():
    config = load_config([SERVER, "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "rollout_pool.nnodes=2",
                          "rollout_pool.n_gpus_per_node=4", "trainer.ray_init.num_cpus=16"])
    placement = server_placement(config, "cuda", cpus_per_process=2.0)
    assert not placement.shared and placement.trainer_fraction == 1.0
    assert (placement.nnodes, placement.servers_per_node) == (2, 2)
    assert placement.actor_resources() == {"num_gpus": 2.0, "num_cpus": 2.0}  # one server per TP=2 devices


def test_colocate_and_cpu_placements_are_unchanged_by_default():
    colocated = server_placement(load_config([]), "cuda", cpus_per_process=1.0)
    assert not colocated.shared and colocated.trainer_fraction == 1.0
    on_cpu = server_placement(load_config([SERVER]), "cpu", cpus_per_process=1.0)
    assert on_cpu.actor_resources() == {"num_gpus": 0.0, "num_cpus": 1.0} and on_cpu.trainer_fraction == 1.0


@pytest.mark.parametrize("fraction", [0.5, 0.3, 0.3333, 0.1])
def test_a_shared_gpu_splits_each_trainer_bundle_exactly(fraction):
    config = load_config([SERVER, *ONE_GPU, f"rollout_pool.gpu_fraction={fraction}",
                          f"actor_rollout_ref.rollout.gpu_memory_utilization={fraction}"])
    for cpus in (1.0, 3.0):
        placement = server_placement(config, "cuda", cpus_per_process=cpus)
        assert placement.shared
        assert placement.server_gpus == fraction
        # Ray keeps 4 decimals: server + trainer must be the bundle, not a hair over it.
        assert round(placement.server_gpus + placement.trainer_fraction, 4) == 1.0
        assert round(placement.server_cpus + cpus * placement.trainer_fraction, 4) <= cpus


def test_a_shared_placement_on_cpu_splits_only_the_cpus():
    config = load_config([SERVER, *ONE_GPU, "rollout_pool.gpu_fraction=0.25",
                          "actor_rollout_ref.rollout.gpu_memory_utilization=0.25"])
    placement = server_placement(config, "cpu", cpus_per_process=2.0)
    assert placement.actor_resources() == {"num_gpus": 0.0, "num_cpus": 0.5} and placement.trainer_fraction == 0.75


def test_servers_at_an_address_ignore_the_pool():
    config = load_config([SERVER, "actor_rollout_ref.rollout.server.address=[http://127.0.0.1:8000]"])
    assert server_placement(config, "cuda", 1.0).trainer_fraction == 1.0


def test_auto_weight_transfer_is_ipc_only_for_started_servers_on_the_one_cuda_device():
    shared = load_config([SERVER, *ONE_GPU, "rollout_pool.gpu_fraction=0.5"])
    assert server_weight_transfer(shared, "cuda") == "ipc"
    assert server_weight_transfer(shared, "cpu") == "gloo"  # no CUDA memory to share
    own_pool = load_config([SERVER, *ONE_GPU])
    assert server_weight_transfer(own_pool, "cuda") == "gloo"  # servers on GPUs of their own
    external = load_config([SERVER, *ONE_GPU, "actor_rollout_ref.rollout.server.address=[http://127.0.0.1:8000]"])
    assert server_weight_transfer(external, "cuda") == "gloo"  # the user's servers keep gloo unless set
    two_devices = load_config([SERVER, "trainer.n_gpus_per_node=2", "rollout_pool.n_gpus_per_node=2",
                               "rollout_pool.gpu_fraction=0.5", "trainer.ray_init.num_cpus=null"])
    assert server_weight_transfer(two_devices, "cuda") == "gloo"  # server 1 is not on rank 0's GPU


def test_an_explicit_weight_transfer_stands():
    gloo = load_config([SERVER, *ONE_GPU, "rollout_pool.gpu_fraction=0.5",
                        "actor_rollout_ref.rollout.server.weight_transfer=gloo"])
    assert server_weight_transfer(gloo, "cuda") == "gloo"
    external = load_config([SERVER, *ONE_GPU, "actor_rollout_ref.rollout.server.address=[http://127.0.0.1:8000]",
                            "actor_rollout_ref.rollout.server.weight_transfer=ipc", "trainer.device=cuda"])
    assert server_weight_transfer(external, "cuda") == "ipc"
