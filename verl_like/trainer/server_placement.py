"""Where the vLLM servers the trainer starts sit, what each Ray actor takes, and how weights reach them
(docs/architecture.md, "Placement").

Two layouts (server mode without rollout.server.address):
- own devices (rollout_pool.gpu_fraction = 0): a pool of rollout_pool.nnodes x n_gpus_per_node devices, one bundle
  of `tensor_model_parallel_size` GPUs per server; the trainer's workers keep whole devices.
- shared (0 < gpu_fraction < 1): no pool of their own. Server k sits on bundle k of the trainer's pool and its
  actor takes gpu_fraction of that bundle (GPU and CPUs); the trainer's worker group takes the rest
  (its resource_fraction). How much device *memory* each uses is not Ray's business: vLLM's
  gpu_memory_utilization <= gpu_fraction is checked with the config (config/pools.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ServerPlacement:
    """shared: the servers sit on the trainer's bundles. nnodes / servers_per_node: the servers' own pool (unused
    when shared). server_gpus / server_cpus: one server actor's num_gpus / num_cpus. trainer_fraction: the share of
    each of its bundles the trainer's worker group takes (1 unless shared)."""

    shared: bool
    nnodes: int
    servers_per_node: int
    server_gpus: float
    server_cpus: float
    trainer_fraction: float

    def actor_resources(self) -> dict[str, float]:
        return {"num_gpus": self.server_gpus, "num_cpus": self.server_cpus}


def server_placement(config: Any, device: str, cpus_per_process: float) -> ServerPlacement:
    """The placement `config` (a validated PPOConfig) asks for on `device` ("cpu" or "cuda")."""
    rollout, pool = config.actor_rollout_ref.rollout, config.rollout_pool
    tp = rollout.tensor_model_parallel_size
    starts_servers = rollout.mode == "server" and not rollout.server.address
    if starts_servers and pool.shares_trainer_devices:
        fraction = pool.gpu_fraction
        return ServerPlacement(
            shared=True, nnodes=pool.nnodes, servers_per_node=pool.n_gpus_per_node,
            server_gpus=fraction if device == "cuda" else 0.0,
            server_cpus=round(cpus_per_process * fraction, 4),
            # Ray counts resources to 4 decimals; rounding keeps server + trainer == the bundle exactly.
            trainer_fraction=round(1.0 - fraction, 4),
        )
    return ServerPlacement(
        shared=False, nnodes=pool.nnodes, servers_per_node=pool.n_gpus_per_node // tp,
        server_gpus=float(tp) if device == "cuda" else 0.0, server_cpus=cpus_per_process, trainer_fraction=1.0,
    )


def server_weight_transfer(config: Any, device: str) -> str:
    """The weight path to the servers ("gloo" or "ipc") that rollout.server.weight_transfer asks for on `device`.

    auto is ipc when the trainer starts its servers on its one CUDA device (rollout_pool.gpu_fraction > 0, one
    trainer device: the one server shares rank 0's GPU), else gloo; servers at server.address keep gloo unless set.
    An explicit value stands (config/pools.py:check_weight_transfer validated it)."""
    rollout = config.actor_rollout_ref.rollout
    choice = rollout.server.weight_transfer
    if choice != "auto":
        return choice
    shared = server_placement(config, device, cpus_per_process=1.0).shared
    return "ipc" if device == "cuda" and shared and config.trainer.world_size == 1 else "gloo"
