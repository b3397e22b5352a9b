"""Topology: each rank's (dp, tp, pp) coordinates and collect flag for fsdp, megatron and rollout layouts."""

from __future__ import annotations

import pytest

from verl_like.config import ConfigError, load_config
from verl_like.config.megatron import MegatronConfig
from verl_like.config.topology import RoleTopology, role_topology, rollout_topology


def _coords(layout: RoleTopology) -> list[tuple[int, int, int, bool]]:
    return [(c.dp_rank, c.tp_rank, c.pp_rank, c.is_collect) for c in layout.ranks]


def test_fsdp_makes_every_rank_its_own_collecting_dp_rank():
    layout = role_topology("actor", 4, "fsdp2", MegatronConfig(tensor_model_parallel_size=2), "actor_rollout_ref.actor")
    assert (layout.dp_size, layout.tp_size, layout.pp_size) == (4, 1, 1)
    assert _coords(layout) == [(r, 0, 0, True) for r in range(4)]


def test_megatron_tp2_pairs_consecutive_ranks_and_collects_from_tp_rank_0():
    layout = role_topology("actor", 4, "megatron", MegatronConfig(tensor_model_parallel_size=2), "x")
    assert layout.dp_size == 2
    assert _coords(layout) == [(0, 0, 0, True), (0, 1, 0, False), (1, 0, 0, True), (1, 1, 0, False)]


def test_megatron_pp2_collects_from_the_last_stage():
    layout = role_topology("critic", 4, "megatron", MegatronConfig(pipeline_model_parallel_size=2), "critic")
    assert layout.dp_size == 2
    assert _coords(layout) == [(0, 0, 0, False), (1, 0, 0, False), (0, 0, 1, True), (1, 0, 1, True)]


def test_megatron_tp2_pp2_on_4_ranks_is_one_replica_collected_on_rank_2():
    config = MegatronConfig(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    layout = role_topology("actor", 4, "megatron", config, "x")
    assert layout.dp_size == 1
    assert _coords(layout) == [(0, 0, 0, False), (0, 1, 0, False), (0, 0, 1, True), (0, 1, 1, False)]
    assert [layout.mesh(r) for r in range(4)] == [(0, 1, False), (0, 1, False), (0, 1, True), (0, 1, False)]


def test_megatron_tp2_pp2_on_8_ranks_follows_megatron_cores_order():
    layout = RoleTopology.build("actor", 8, tp_size=2, pp_size=2)
    # rank = pp * (dp * tp) + dp * tp + tp: DP groups stride by tp, PP groups by dp * tp.
    assert [c.dp_rank for c in layout.ranks] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert [c.pp_rank for c in layout.ranks] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [r for r, c in enumerate(layout.ranks) if c.is_collect] == [4, 6]


def test_rollout_tp_groups_are_consecutive_ranks():
    layout = rollout_topology(4, 2)
    assert [layout.tp_group(r) for r in range(4)] == [(0, 1), (0, 1), (2, 3), (2, 3)]
    assert [layout.mesh(r) for r in range(4)] == [(0, 2, True), (0, 2, False), (1, 2, True), (1, 2, False)]
    with pytest.raises(ConfigError, match="tensor_model_parallel_size=3 does not divide the 4 ranks"):
        rollout_topology(4, 3)


def test_a_rank_outside_the_role_is_refused():
    with pytest.raises(ValueError, match="rank 4 is outside the role's 4 ranks"):
        RoleTopology.build("actor", 4).coord(4)


def test_the_jobs_topology_has_every_running_role():
    config = load_config(["trainer.n_gpus_per_node=4", "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                          "actor_rollout_ref.actor.use_kl_loss=true", "algorithm.adv_estimator=gae"],
                         check_paths=False)
    topology = config.derived.topology
    assert topology.actor.dp_size == topology.ref.dp_size == topology.critic.dp_size == 4
    assert topology.rollout.dp_size == config.derived.rollout_dp_size == 2
    server = load_config(["actor_rollout_ref.rollout.mode=server"], check_paths=False).derived.topology
    assert server.rollout is None and server.ref is None and server.critic is None
