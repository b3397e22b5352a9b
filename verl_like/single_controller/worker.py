"""`Worker`: the base class of every role (actor, rollout, reference, critic, reward model)."""

from __future__ import annotations

import datetime
import logging
import os

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
        dist.init_process_group(
            backend=backend,
            rank=self.rank,
            world_size=self.world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
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
