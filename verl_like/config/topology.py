"""Topology: every role's parallel layout, decided once on the driver from the validated config and the pool sizes.

Each worker gets its role's `RoleTopology` at construction and registers its dispatch mesh from it; nothing else
computes `rank // tp` or checks that a size divides the world.

Rank order inside a role (the order Megatron-core's `initialize_model_parallel` uses by default, "tp-cp-ep-dp-pp";
an engine must build its groups the same way, or the driver sends data to the wrong ranks):

    rank = pp_rank * (dp_size * tp_size) + dp_rank * tp_size + tp_rank

so TP groups are consecutive ranks, a DP group strides by tp_size and a PP group by dp_size * tp_size. FSDP roles
have tp = pp = 1 (every rank its own DP rank); a rollout's TP groups are consecutive ranks (pp = 1). The collect
rank of a DP rank (the one whose output the driver keeps) is its TP rank 0 on the last pipeline stage, which holds
the model's outputs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from verl_like.config.errors import ConfigError
from verl_like.config.megatron import MegatronConfig
from verl_like.config.placement import rollout_in_workers

if TYPE_CHECKING:
    from verl_like.config.actor import ActorConfig
    from verl_like.config.model import RefConfig
    from verl_like.config.ppo import PPOConfig
    from verl_like.config.rollout import RolloutConfig


@dataclass(frozen=True)
class RankCoord:
    """Where one rank sits in its role: its data-, tensor- and pipeline-parallel ranks, and whether it collects."""

    dp_rank: int
    tp_rank: int
    pp_rank: int
    is_collect: bool


@dataclass(frozen=True)
class RoleTopology:
    """The layout of one role over `world_size` ranks (world_size = tp_size * pp_size * dp_size).

    role: "actor", "ref", "critic" or "rollout" (also the name of the dispatch mesh the workers register).
    ranks[r]: RankCoord of the role's rank r.
    """

    role: str
    world_size: int
    tp_size: int
    pp_size: int
    dp_size: int
    ranks: tuple[RankCoord, ...]

    @classmethod
    def build(cls, role: str, world_size: int, tp_size: int = 1, pp_size: int = 1) -> RoleTopology:
        """The layout in the module doc's rank order; ValueError when tp * pp does not divide world_size."""
        if world_size < 1 or tp_size < 1 or pp_size < 1:
            raise ValueError(f"{role}: world_size={world_size}, tp={tp_size} and pp={pp_size} must be >= 1")
        if world_size % (tp_size * pp_size):
            raise ValueError(f"{role}: tp={tp_size} x pp={pp_size} does not divide the {world_size} ranks")
        dp_size = world_size // (tp_size * pp_size)
        ranks = []
        for rank in range(world_size):
            tp_rank, dp_rank, pp_rank = rank % tp_size, (rank // tp_size) % dp_size, rank // (tp_size * dp_size)
            ranks.append(RankCoord(dp_rank, tp_rank, pp_rank, is_collect=tp_rank == 0 and pp_rank == pp_size - 1))
        return cls(role, world_size, tp_size, pp_size, dp_size, tuple(ranks))

    def coord(self, rank: int) -> RankCoord:
        """The RankCoord of the role's rank `rank`; ValueError for a rank outside the role."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"{self.role}: rank {rank} is outside the role's {self.world_size} ranks")
        return self.ranks[rank]

    def mesh(self, rank: int) -> tuple[int, int, bool]:
        """(dp_rank, dp_size, is_collect) of `rank`: the arguments of `Worker.register_mesh`."""
        coord = self.coord(rank)
        return coord.dp_rank, self.dp_size, coord.is_collect

    def tp_group(self, rank: int) -> tuple[int, ...]:
        """The ranks of `rank`'s tensor-parallel group (consecutive ranks), `rank` included."""
        first = rank - self.coord(rank).tp_rank
        return tuple(range(first, first + self.tp_size))


def role_topology(role: str, world_size: int, strategy: str, megatron: MegatronConfig, prefix: str) -> RoleTopology:
    """A trained role's layout: every rank a DP rank for fsdp2, megatron's TP x PP x DP otherwise; ConfigError
    naming `prefix`.megatron when TP x PP does not divide the role's world."""
    if strategy != "megatron":
        return RoleTopology.build(role, world_size)
    try:
        megatron.dp_size(world_size, prefix)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    return RoleTopology.build(
        role, world_size, megatron.tensor_model_parallel_size, megatron.pipeline_model_parallel_size
    )


def rollout_topology(world_size: int, tp_size: int) -> RoleTopology:
    """The colocated rollout's TP groups of consecutive ranks; ConfigError naming the key when TP does not divide."""
    if world_size % tp_size:
        raise ConfigError(
            f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp_size} does not divide the {world_size} ranks "
            "of the actor-rollout group (trainer.nnodes * trainer.n_gpus_per_node); choose a TP size that divides it"
        )
    return RoleTopology.build("rollout", world_size, tp_size)


@dataclass(frozen=True)
class Topology:
    """Every role's layout for one job (`config.derived.topology`).

    actor / ref: the trainer group's policy and reference (ref None when no reference runs).
    critic: the value model's, over its pool (None when no critic runs).
    rollout: the colocated engine's TP groups over the actor's ranks (None with rollout.mode=server, whose
      servers sit on their own pool).
    """

    actor: RoleTopology
    ref: RoleTopology | None
    critic: RoleTopology | None
    rollout: RoleTopology | None

    @classmethod
    def of(cls, config: PPOConfig, use_reference: bool, use_critic: bool) -> Topology:
        """The layout of `config`'s roles; ConfigError naming the key when a size does not divide its world."""
        arr = config.actor_rollout_ref
        group = actor_group_topology(config.trainer.world_size, arr.actor, arr.ref if use_reference else None,
                                     arr.rollout)
        if not use_critic:
            return group
        critic = config.critic
        world = config.trainer.world_size if config.critic_pool.colocated else config.critic_pool.world_size
        layout = role_topology("critic", world, critic.strategy, critic.megatron, critic.PREFIX)
        return dataclasses.replace(group, critic=layout)


def actor_group_topology(
    world_size: int, actor: ActorConfig, ref: RefConfig | None, rollout: RolloutConfig
) -> Topology:
    """The actor-rollout group's layouts (critic None): `Topology.of` uses it, and so does a group a test or a
    script starts by hand without the driver's Topology."""
    actor_layout = role_topology("actor", world_size, actor.strategy, actor.megatron, actor.PREFIX)
    ref_layout = None
    if ref is not None:
        ref_layout = role_topology("ref", world_size, ref.strategy or actor.strategy, ref.megatron or actor.megatron,
                                   "actor_rollout_ref.ref")
    rollout_layout = None
    if rollout_in_workers(rollout):
        rollout_layout = rollout_topology(world_size, rollout.tensor_model_parallel_size)
    return Topology(actor_layout, ref_layout, None, rollout_layout)
