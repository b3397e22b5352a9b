"""`Worker`: the base class of every role (actor, rollout, reference, critic, reward model)."""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import socket

import torch
import torch.distributed as dist

from verl_like.utils.device import get_dist_backend, is_cuda_available

logger = logging.getLogger(__name__)


class Worker:
    """A role running in one Ray actor process, at one rank of its group.

    The group sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT before the role
    is constructed; `init_distributed` builds the torch.distributed world from them. Several roles colocated in
    one process share that world. Methods decorated with `@register` can be called through the group.
    """

    @property
    def rank(self) -> int:
        return int(os.environ["RANK"])

    @property
    def world_size(self) -> int:
        return int(os.environ["WORLD_SIZE"])

    @property
    def local_rank(self) -> int:
        return int(os.environ["LOCAL_RANK"])

    def init_distributed(self, timeout_s: float = 600.0) -> None:
        """Joins this process to the group's torch.distributed world (gloo on CPU, nccl+gloo on GPU), once."""
        if dist.is_initialized():
            return
        backend = get_dist_backend()
        if is_cuda_available():
            torch.cuda.set_device(self.local_rank)
        logger.info("rank %d/%d: init_process_group(%s)", self.rank, self.world_size, backend)
        timeout = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(
            backend=backend,
            rank=self.rank,
            world_size=self.world_size,
            timeout=timeout,
            store=self._loopback_store(timeout),
        )

    def _loopback_store(self, timeout: datetime.timedelta) -> dist.TCPStore | None:
        """The rendezvous store bound to MASTER_ADDR when that is a loopback address (a one-node local cluster);
        None otherwise (env:// rendezvous, whose store listens on every interface, as other nodes must reach it).

        torch's TCPStore server binds all interfaces unless handed a socket that is already listening.
        """
        address = os.environ["MASTER_ADDR"]
        try:
            if not ipaddress.ip_address(address).is_loopback:
                return None
        except ValueError:  # a hostname
            return None
        port = int(os.environ["MASTER_PORT"])
        if self.rank != 0:
            return dist.TCPStore(address, port, self.world_size, is_master=False, timeout=timeout)
        listener = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((address, port))
        listener.listen(128)
        return dist.TCPStore(
            address, port, self.world_size, is_master=True, timeout=timeout, wait_for_workers=False,
            master_listen_fd=listener.detach(),  # the store owns the socket from here on
        )

    def register_mesh(self, name: str, dp_rank: int, dp_size: int, is_collect: bool) -> None:
        """Declares this worker's place in mesh `name` for `Dispatch.DP_MESH` calls.

        Workers with the same `dp_rank` receive the same chunk of data; exactly one of them (`is_collect`)
        returns its result to the driver.
        """
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"register_mesh({name!r}): dp_rank={dp_rank} is outside [0, dp_size={dp_size})")
        self._mesh_table()[name] = (dp_rank, dp_size, is_collect)

    def mesh_declaration(self, name: str) -> tuple[int, int, bool] | None:
        """(dp_rank, dp_size, is_collect) declared for mesh `name`, or None if this worker declared none."""
        return self._mesh_table().get(name)

    def _mesh_table(self) -> dict[str, tuple[int, int, bool]]:
        # Created on first use so that subclasses need not call Worker.__init__.
        return self.__dict__.setdefault("_verl_like_meshes", {})
