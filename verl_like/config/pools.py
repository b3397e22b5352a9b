"""ResourcePoolConfig: a pool of devices of its own for one role (`rollout_pool`), verl's pool keys."""

from __future__ import annotations

from dataclasses import dataclass

from verl_like.config.errors import ConfigError


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
