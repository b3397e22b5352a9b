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
      gpu_fraction: 0 (default) gives the servers devices of their own. A value in (0, 1) puts them on the
        trainer's devices instead (e.g. one GPU for trainer and server): one server per trainer device (TP 1;
        nnodes / n_gpus_per_node must then equal the trainer's), its Ray actor taking gpu_fraction of that
        device's bundle (GPU and CPUs) and the trainer's worker the rest. vLLM's rollout.gpu_memory_utilization
        must not exceed it, so the trainer keeps at least 1 - gpu_fraction of the device's memory.
    """

    nnodes: int = 1
    n_gpus_per_node: int = 1
    gpu_fraction: float = 0.0

    def __post_init__(self) -> None:
        if self.nnodes < 1 or self.n_gpus_per_node < 1:
            raise ConfigError(
                f"rollout_pool.nnodes={self.nnodes} and rollout_pool.n_gpus_per_node={self.n_gpus_per_node} "
                "must both be >= 1"
            )
        # Ray keeps resources to 4 decimals: a finer fraction would not add up to the bundle with the trainer's.
        if not 0 <= self.gpu_fraction < 1 or round(self.gpu_fraction, 4) != self.gpu_fraction:
            raise ConfigError(
                f"rollout_pool.gpu_fraction={self.gpu_fraction} must be 0 (servers on devices of their own) or in "
                "(0, 1) with at most 4 decimals (the servers' share of each trainer device), e.g. 0.5"
            )

    @property
    def shares_trainer_devices(self) -> bool:
        return self.gpu_fraction > 0

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
    """(processes, GPUs) a run places on its cluster: the trainer's group, the vLLM servers it starts on
    rollout_pool (one process per TP devices) and roles on pools of their own."""
    processes = gpus = config.trainer.world_size
    placement = config.placement
    # Servers sharing the trainer's devices take fractions of its bundles: no slots of their own.
    if placement.pool_devices:
        processes += placement.servers
        gpus += placement.pool_devices
    for pool in (config.critic_pool, config.reward_model_pool):
        processes += pool.world_size
        gpus += pool.world_size
    return processes, gpus


def cluster_summary(config: "PPOConfig") -> str:
    """Who takes the cluster's slots, for error messages."""
    parts = [f"trainer.nnodes x trainer.n_gpus_per_node = {config.trainer.world_size} trainer workers"]
    servers = config.placement.describe()
    if servers:
        parts.append(servers)
    for name in ("critic_pool", "reward_model_pool"):
        size = getattr(config, name).world_size
        if size:
            parts.append(f"{size} on {name}")
    return " + ".join(parts)
