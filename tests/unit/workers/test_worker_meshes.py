"""Workers register their dispatch meshes from the driver's Topology, and the meshes route as the layout says."""

from __future__ import annotations

import pytest

from verl_like.config.actor import ActorConfig
from verl_like.config.critic import CriticConfig
from verl_like.config.megatron import MegatronConfig
from verl_like.config.model import RefConfig
from verl_like.config.rollout import RolloutConfig
from verl_like.config.topology import actor_group_topology, role_topology
from verl_like.single_controller.dispatch import build_mesh_info
from verl_like.workers.actor_rollout import ActorRolloutWorker
from verl_like.workers.critic import CriticWorker

TP2 = MegatronConfig(tensor_model_parallel_size=2)


def _at_rank(monkeypatch, rank: int, world: int) -> None:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))


def _actor_meshes(monkeypatch, topology, world: int) -> list[ActorRolloutWorker]:
    workers = []
    for rank in range(world):
        _at_rank(monkeypatch, rank, world)
        worker = ActorRolloutWorker.__new__(ActorRolloutWorker)  # the meshes only; no model or process group
        worker.topology = topology
        worker._register_meshes(topology)
        workers.append(worker)
    return workers


def test_a_megatron_actor_registers_megatrons_dp_ranks_and_the_rollout_its_tp_groups(monkeypatch):
    actor = ActorConfig(ppo_micro_batch_size_per_gpu=1, strategy="megatron",
                        megatron=MegatronConfig(pipeline_model_parallel_size=2))
    topology = actor_group_topology(4, actor, RefConfig(strategy="megatron", megatron=TP2),
                                    RolloutConfig(tensor_model_parallel_size=2))
    workers = _actor_meshes(monkeypatch, topology, 4)
    for name, layout in (("actor", topology.actor), ("ref", topology.ref), ("rollout", topology.rollout)):
        declared = [worker.mesh_declaration(name) for worker in workers]
        assert declared == [layout.mesh(rank) for rank in range(4)]
    actor_mesh = build_mesh_info("actor", [w.mesh_declaration("actor") for w in workers])
    assert actor_mesh.collect_ranks == (2, 3)  # PP2: the last stage's ranks return the outputs
    assert build_mesh_info("ref", [w.mesh_declaration("ref") for w in workers]).collect_ranks == (0, 2)
    assert build_mesh_info("rollout", [w.mesh_declaration("rollout") for w in workers]).dp_rank_of == (0, 0, 1, 1)


def test_without_a_reference_the_ref_mesh_is_the_actors_and_server_mode_has_no_rollout_mesh(monkeypatch):
    topology = actor_group_topology(2, ActorConfig(ppo_micro_batch_size_per_gpu=1), None, RolloutConfig(mode="server"))
    workers = _actor_meshes(monkeypatch, topology, 2)
    assert [w.mesh_declaration("ref") for w in workers] == [(0, 2, True), (1, 2, True)]
    assert all(w.mesh_declaration("rollout") is None for w in workers)


def test_a_topology_of_another_world_is_refused(monkeypatch):
    topology = actor_group_topology(4, ActorConfig(ppo_micro_batch_size_per_gpu=1), None, RolloutConfig())
    with pytest.raises(ValueError, match="the actor topology spans 4 ranks but this group has 2"):
        _actor_meshes(monkeypatch, topology, 2)


def test_a_critic_worker_registers_the_critic_mesh_from_its_topology(monkeypatch):
    config = CriticConfig(ppo_micro_batch_size_per_gpu=1, strategy="megatron", megatron=TP2)
    layout = role_topology("critic", 4, "megatron", TP2, "critic")
    declared = []
    for rank in range(4):
        _at_rank(monkeypatch, rank, 4)
        declared.append(CriticWorker(config, "/model", rollout_n=2, topology=layout).mesh_declaration("critic"))
    assert declared == [(0, 2, True), (0, 2, False), (1, 2, True), (1, 2, False)]
    _at_rank(monkeypatch, 0, 4)
    assert CriticWorker(config, "/model", rollout_n=2).mesh_declaration("critic") == (0, 2, True)  # same rules
