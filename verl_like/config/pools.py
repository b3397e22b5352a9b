"""ResourcePoolConfig: a pool of devices of its own for one role (`rollout_pool`), verl's pool keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from verl_like.config.errors import ConfigError

if TYPE_CHECKING:
    from verl_like.config.ppo import PPOConfig


@dataclass(frozen=True)
class ResourcePoolConfig:
    """`rollout_pool`: the devices of the vLLM servers in server mode (unused in colocate mode).

      nnodes / n_gpus_per_node: nnodes * n_gpus_per_node devices (on CPU: server processes' slots); every
        actor_rollout_ref.rollout.tensor_model_parallel_size of them on one node make one server, and several
        servers are data parallel (requests are balanced across them).
    """

    nnodes: int = 1
    n_gpus_per_node: int = 1

    def __post_init__(self) -> None:
        if self.nnodes < 1 or self.n_gpus_per_node < 1:
            raise ConfigError(
                f"rollout_pool.nnodes={self.nnodes} and rollout_pool.n_gpus_per_node={self.n_gpus_per_node} "
                "must both be >= 1"
            )

    @property
    def world_size(self) -> int:
        return self.nnodes * self.n_gpus_per_node


@dataclass(frozen=True)
class RolePoolConfig:
    """`critic_pool` / `reward_model_pool`: a role's own devices (verl's pool mapping); 0 and 0 (the default)
    keep the role colocated with the actor, in the same processes on the same devices.

      nnodes / n_gpus_per_node: the role's group spans nnodes * n_gpus_per_node processes of its own.
    """

    nnodes: int = 0
    n_gpus_per_node: int = 0

    def __post_init__(self) -> None:
        if (self.nnodes == 0) != (self.n_gpus_per_node == 0) or self.nnodes < 0 or self.n_gpus_per_node < 0:
            raise ConfigError(
                f"a role pool's nnodes={self.nnodes} and n_gpus_per_node={self.n_gpus_per_node} must both be >= 1 "
                "(a pool of its own) or both 0 (colocated with the actor)"
            )

    @property
    def colocated(self) -> bool:
        return self.nnodes == 0

    @property
    def world_size(self) -> int:
        return self.nnodes * self.n_gpus_per_node


def cluster_processes(config: "PPOConfig") -> tuple[int, int]:
    """(processes, GPUs) a run places on its cluster: the trainer's group, the vLLM servers it starts (server mode
    without server.address: one process per TP devices of rollout_pool) and roles on pools of their own."""
    processes = gpus = config.trainer.world_size
    rollout = config.actor_rollout_ref.rollout
    if rollout.mode == "server" and not rollout.server.address:
        processes += config.rollout_pool.world_size // rollout.tensor_model_parallel_size
        gpus += config.rollout_pool.world_size
    for pool in (config.critic_pool, config.reward_model_pool):
        processes += pool.world_size
        gpus += pool.world_size
    return processes, gpus


def cluster_summary(config: "PPOConfig") -> str:
    """Who takes the cluster's slots, for error messages."""
    rollout = config.actor_rollout_ref.rollout
    parts = [f"trainer.nnodes x trainer.n_gpus_per_node = {config.trainer.world_size} trainer workers"]
    if rollout.mode == "server" and not rollout.server.address:
        parts.append(f"{config.rollout_pool.world_size // rollout.tensor_model_parallel_size} vLLM server(s) on "
                     f"rollout_pool ({config.rollout_pool.world_size} devices)")
    for name in ("critic_pool", "reward_model_pool"):
        size = getattr(config, name).world_size
        if size:
            parts.append(f"{size} on {name}")
    return " + ".join(parts)
