"""RolloutPlacement: where the rollout runs, decided once from the config (`PPOConfig.placement`).

Four placements (docs/architecture.md, "Placement"), read from rollout.mode, rollout.server.address and
rollout_pool.gpu_fraction here and nowhere else:
- COLOCATED: the engine lives in every trainer process (verl's hybrid engine).
- OWN_POOL: the trainer starts vLLM servers on rollout_pool, devices of their own, one per TP devices.
- TRAINER_DEVICES: the trainer starts one server on each of its devices, which takes gpu_fraction of the device's
  Ray bundle (GPU and CPUs) and leaves the trainer's worker group the rest.
- USER_SERVERS: servers the user started, at rollout.server.address.
Validation (`check_server_placement`, `check_weight_transfer`), the cluster's slot count, preflight, setup, the
rollout handle and the weight path read this value instead of the keys.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from verl_like.config.errors import ConfigError

if TYPE_CHECKING:
    from verl_like.config.ppo import PPOConfig
    from verl_like.config.rollout import RolloutConfig


class PlacementKind(enum.Enum):
    COLOCATED = "colocated"
    OWN_POOL = "own_pool"
    TRAINER_DEVICES = "trainer_devices"
    USER_SERVERS = "user_servers"


def rollout_in_workers(rollout: RolloutConfig) -> bool:
    """Whether the engine lives in the trainer's workers (rollout.mode=colocate) rather than in servers."""
    return rollout.mode == "colocate"


@dataclass(frozen=True)
class RolloutPlacement:
    """The rollout's placement and its sizes.

    kind: the PlacementKind. tp_size: rollout.tensor_model_parallel_size.
    servers: vLLM servers (0 when colocated): started ones on their devices, or the user's addresses.
    nnodes / servers_per_node: where started servers sit (rollout_pool's nodes; 0 for COLOCATED / USER_SERVERS).
    pool_devices: devices of rollout_pool the servers take (OWN_POOL only; the others take no slot of their own).
    gpu_fraction: a server's share of each trainer device's bundle (TRAINER_DEVICES only, else 0).
    addresses: the user's servers (USER_SERVERS only).
    weight_transfer_choice: rollout.server.weight_transfer as set ("auto", "gloo" or "ipc"); `weight_transfer(device)`
      resolves auto. trainer_devices: trainer.nnodes * n_gpus_per_node (auto's ipc needs exactly one).
    """

    kind: PlacementKind
    tp_size: int
    servers: int = 0
    nnodes: int = 0
    servers_per_node: int = 0
    pool_devices: int = 0
    gpu_fraction: float = 0.0
    addresses: tuple[str, ...] = ()
    weight_transfer_choice: str = "auto"
    trainer_devices: int = 1

    @classmethod
    def of(cls, config: PPOConfig) -> RolloutPlacement:
        """The placement `config` asks for; never raises (`check_server_placement` and `check_whole_servers`
        report a placement that does not fit)."""
        rollout, pool = config.actor_rollout_ref.rollout, config.rollout_pool
        tp = rollout.tensor_model_parallel_size
        common = dict(tp_size=tp, weight_transfer_choice=rollout.server.weight_transfer,
                      trainer_devices=config.trainer.world_size)
        if rollout_in_workers(rollout):
            return cls(PlacementKind.COLOCATED, **common)
        if rollout.server.address:
            return cls(PlacementKind.USER_SERVERS, servers=len(rollout.server.address),
                       addresses=tuple(rollout.server.address), **common)
        if pool.gpu_fraction > 0:
            return cls(PlacementKind.TRAINER_DEVICES, servers=pool.world_size // tp, nnodes=pool.nnodes,
                       servers_per_node=pool.n_gpus_per_node, gpu_fraction=pool.gpu_fraction, **common)
        return cls(PlacementKind.OWN_POOL, servers=pool.world_size // tp, nnodes=pool.nnodes,
                   servers_per_node=pool.n_gpus_per_node // tp, pool_devices=pool.world_size, **common)

    @property
    def uses_servers(self) -> bool:
        return self.kind is not PlacementKind.COLOCATED

    @property
    def starts_servers(self) -> bool:
        """Whether the trainer starts (and supervises) the servers."""
        return self.kind in (PlacementKind.OWN_POOL, PlacementKind.TRAINER_DEVICES)

    @property
    def shares_trainer_devices(self) -> bool:
        return self.kind is PlacementKind.TRAINER_DEVICES

    @property
    def servers_start_early(self) -> bool:
        """Whether the servers launch before the trainer's workers, so that their start overlaps the workers':
        on devices of their own (servers on the trainer's devices wait for its models when vLLM sizes its KV cache,
        from the memory it sees change; trainer/setup.py starts them early too when their KV cache's size is
        given; a user's servers run already)."""
        return self.kind is PlacementKind.OWN_POOL

    @property
    def trainer_fraction(self) -> float:
        """The share of each of its bundles the trainer's worker group takes (1 unless servers share them)."""
        # Ray counts resources to 4 decimals; rounding keeps server + trainer == the bundle exactly.
        return round(1.0 - self.gpu_fraction, 4) if self.shares_trainer_devices else 1.0

    def server_resources(self, device: str, cpus_per_process: float) -> dict[str, float]:
        """One started server actor's Ray resources on `device` ("cpu" or "cuda")."""
        if self.shares_trainer_devices:
            return {"num_gpus": self.gpu_fraction if device == "cuda" else 0.0,
                    "num_cpus": round(cpus_per_process * self.gpu_fraction, 4)}
        return {"num_gpus": float(self.tp_size) if device == "cuda" else 0.0, "num_cpus": cpus_per_process}

    def weight_transfer(self, device: str) -> str:
        """The servers' weight-transfer engine ("gloo" or "ipc") on the trainer's `device`.

        auto is ipc when the trainer starts its one server on its one CUDA device (the server shares rank 0's GPU),
        else gloo; a user's servers keep gloo unless set. An explicit value stands (`check_weight_transfer`)."""
        if self.weight_transfer_choice != "auto":
            return self.weight_transfer_choice
        ipc = device == "cuda" and self.shares_trainer_devices and self.trainer_devices == 1
        return "ipc" if ipc else "gloo"

    def describe(self) -> str | None:
        """Who the servers are, for error messages about the cluster's slots (None: no servers of ours)."""
        if self.kind is PlacementKind.TRAINER_DEVICES:
            return (f"{self.trainer_devices} vLLM server(s) sharing the trainer's devices "
                    f"(rollout_pool.gpu_fraction={self.gpu_fraction:g})")
        if self.kind is PlacementKind.OWN_POOL:
            return f"{self.servers} vLLM server(s) on rollout_pool ({self.pool_devices} devices)"
        return None


def check_whole_servers(config: PPOConfig) -> None:
    """Started servers' TP ranks sit on one node: rollout TP must divide rollout_pool.n_gpus_per_node."""
    placement, pool = config.placement, config.rollout_pool
    tp = placement.tp_size
    if placement.starts_servers and pool.n_gpus_per_node % tp:
        raise ConfigError(
            f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp} does not divide "
            f"rollout_pool.n_gpus_per_node={pool.n_gpus_per_node} (a server's TP ranks sit on one node); choose a "
            "TP size that divides it"
        )


def check_server_placement(config: PPOConfig) -> None:
    """rollout_pool.gpu_fraction > 0 (servers on the trainer's devices) must fit the rest of the placement."""
    pool, trainer, rollout = config.rollout_pool, config.trainer, config.actor_rollout_ref.rollout
    if not pool.shares_trainer_devices:
        return
    kind = config.placement.kind
    key = f"rollout_pool.gpu_fraction={pool.gpu_fraction:g}"
    if kind is PlacementKind.COLOCATED:
        raise ConfigError(f"{key} places vLLM servers, which only actor_rollout_ref.rollout.mode=server starts; set "
                          "rollout_pool.gpu_fraction=0 (the colocated engine already shares the trainer's devices)")
    if kind is PlacementKind.USER_SERVERS:
        raise ConfigError(f"{key} places the servers the trainer starts, but rollout.server.address names servers "
                          "you started; set one of them")
    if rollout.tensor_model_parallel_size != 1:
        raise ConfigError(
            f"{key} puts one server on each trainer device, so actor_rollout_ref.rollout.tensor_model_parallel_size"
            f"={rollout.tensor_model_parallel_size} must be 1; set rollout_pool.gpu_fraction=0 to give TP servers "
            "devices of their own"
        )
    if (pool.nnodes, pool.n_gpus_per_node) != (trainer.nnodes, trainer.n_gpus_per_node):
        raise ConfigError(
            f"{key} puts one server on each trainer device, but rollout_pool.nnodes={pool.nnodes} x "
            f"n_gpus_per_node={pool.n_gpus_per_node} differs from trainer.nnodes={trainer.nnodes} x "
            f"n_gpus_per_node={trainer.n_gpus_per_node}; set rollout_pool's to the trainer's"
        )
    if rollout.gpu_memory_utilization > pool.gpu_fraction:
        raise ConfigError(
            f"actor_rollout_ref.rollout.gpu_memory_utilization={rollout.gpu_memory_utilization:g} exceeds {key}: "
            f"the server would take device memory the trainer's share (1 - gpu_fraction) needs; set "
            f"gpu_memory_utilization <= {pool.gpu_fraction:g} or raise gpu_fraction"
        )


def check_weight_transfer(config: PPOConfig) -> None:
    """rollout.server.weight_transfer=ipc needs CUDA and every server on the trainer's rank-0 GPU (the sender's)."""
    placement, trainer = config.placement, config.trainer
    if not placement.uses_servers or placement.weight_transfer_choice != "ipc":
        return
    key = "actor_rollout_ref.rollout.server.weight_transfer=ipc"
    if trainer.device == "cpu":
        raise ConfigError(f"{key} moves CUDA memory, but trainer.device=cpu; set weight_transfer=gloo (or auto)")
    if placement.kind is PlacementKind.USER_SERVERS:
        return  # the user's servers: the sender checks at connect that they sit on its GPU (by GPU UUID)
    if not placement.shares_trainer_devices:
        raise ConfigError(
            f"{key} needs the servers on the trainer's GPU, but rollout_pool.gpu_fraction=0 gives them devices of "
            "their own; set rollout_pool.gpu_fraction in (0, 1) or weight_transfer=gloo (or auto)"
        )
    if trainer.world_size != 1:
        raise ConfigError(
            f"{key}: the trainer's rank 0 sends, and with trainer.nnodes x n_gpus_per_node={trainer.world_size} "
            "devices the servers of the other devices sit on other GPUs; use one trainer device or "
            "weight_transfer=gloo (or auto)"
        )
