"""`WorkerHost`: the Ray actor behind one rank of a group; it holds one or more colocated roles."""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from typing import Any

import ray

from verl_like.protocol import DataProto, unpad
from verl_like.utils.device import visible_device_index
from verl_like.utils.quiet_logs import install_noise_filters

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RoleSpec:
    """A role to construct in every process of a group: `cls(*args, **kwargs)`."""

    cls: type
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ProtoChunkRef:
    """One DP chunk of another group's not-yet-collected DataProto result, resolved inside the worker.

    The worker fetches the producer's result chunks straight from the object store, so chained calls
    (`group_b.f(group_a.g(data, blocking=False))`) never route the data through the driver.
    """

    refs: tuple[ray.ObjectRef, ...]
    pad_size: int
    index: int
    num_chunks: int

    def resolve(self) -> DataProto:
        parts = ray.get(list(self.refs))
        full = unpad(DataProto.concat(parts), self.pad_size)
        if len(full) % self.num_chunks:
            raise ValueError(
                f"a chained DataProto of {len(full)} rows cannot be split evenly over {self.num_chunks} DP ranks; "
                "use batch sizes divisible by every group's DP size, or collect on the driver (blocking=True)"
            )
        return full.chunk(self.num_chunks)[self.index]


def _resolve(value: Any) -> Any:
    return value.resolve() if isinstance(value, ProtoChunkRef) else value


class WorkerHost:
    """Runs in its own process; constructs the roles once the group knows the rendezvous address."""

    def __init__(
        self, rank: int, world_size: int, local_rank: int, local_world_size: int, device: str = "cpu"
    ) -> None:
        if device == "cuda":
            # LOCAL_RANK names this process's CUDA device for FSDP and vLLM; Ray shows a GPU worker only its own.
            local_rank = visible_device_index(local_rank)
        self._rank_env = {
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(local_world_size),
        }
        os.environ.update(self._rank_env)
        install_noise_filters()  # vLLM's harmless per-step warnings, below trainer.log_level
        self._roles: dict[str, Any] = {}

    def rendezvous_address(self) -> tuple[str, int]:
        """This node's IP and a free TCP port, for MASTER_ADDR/MASTER_PORT (asked of rank 0)."""
        ip = ray.util.get_node_ip_address()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return ip, port

    def init_roles(self, roles: dict[str, RoleSpec], master_addr: str, master_port: int) -> None:
        """Sets the rendezvous env and constructs every role, in the order given."""
        os.environ["MASTER_ADDR"] = master_addr
        os.environ["MASTER_PORT"] = str(master_port)
        for name, spec in roles.items():
            self._roles[name] = spec.cls(*spec.args, **spec.kwargs)

    def mesh_declaration(self, role: str, mesh: str) -> tuple[int, int, bool] | None:
        worker = self._roles[role]
        declare = getattr(worker, "mesh_declaration", None)
        return declare(mesh) if declare is not None else None

    def execute(self, role: str, method: str, collect: bool, args: tuple, kwargs: dict) -> Any:
        """Calls `role.method(*args, **kwargs)`; returns None instead of the result on non-collecting ranks."""
        fn = getattr(self._roles[role], method)
        result = fn(*(_resolve(a) for a in args), **{k: _resolve(v) for k, v in kwargs.items()})
        return result if collect else None

    def ping(self) -> int:
        return os.getpid()
