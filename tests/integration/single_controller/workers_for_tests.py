"""Worker roles used by the single-controller tests (importable by Ray worker processes)."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from verl_like.protocol import DataProto
from verl_like.single_controller import Dispatch, Execute, Worker, register


class EchoWorker(Worker):
    """Records calls; each method shows one dispatch mode."""

    def __init__(self, tag: str = "echo") -> None:
        self.tag = tag
        self.state: dict[str, object] = {}

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def whoami(self) -> dict:
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "local_rank": self.local_rank,
            "master": (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]),
            "pid": os.getpid(),
            "tag": self.tag,
        }

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def set_state(self, key: str, value: object) -> None:
        self.state[key] = value

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def get_state(self, key: str) -> object:
        return self.state.get(key)

    @register(dispatch=Dispatch.ALL_TO_ALL)
    def scale(self, x: int, factor: int = 1) -> int:
        return x * factor + self.rank

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO)
    def double(self, data: DataProto) -> DataProto:
        out = DataProto.from_dict(
            tensors={"y": data.batch["x"] * 2, "rank": torch.full((len(data),), self.rank)},
            non_tensors={"name": data.non_tensor_batch["name"]},
        )
        return out

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def double_async(self, data: DataProto) -> DataProto:
        return self.double(data)

    @register(dispatch=Dispatch.ONE_TO_ALL, execute=Execute.RANK_ZERO)
    def only_rank_zero(self, value: int) -> tuple[int, int]:
        return self.rank, value

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def all_reduce_rank(self) -> float:
        self.init_distributed(timeout_s=60)
        t = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(t)
        return t.item()

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def listening_addresses(self) -> list[tuple[str, int]]:
        """(ip, port) of every TCP socket this worker process listens on (Ray's, torch.distributed's, gloo's)."""
        import psutil

        conns = psutil.Process().net_connections(kind="inet")
        return [(c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def fail_on(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"deliberate failure on rank {self.rank}")
        return self.rank

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def sleep_on(self, rank: int, seconds: float) -> int:
        if self.rank == rank:
            time.sleep(seconds)
        return self.rank

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def die_on(self, rank: int) -> int:
        if self.rank == rank:
            os._exit(1)
        return self.rank

    def not_registered(self) -> None:
        """A plain method: not callable through the group."""


class MeshWorker(Worker):
    """Two TP peers per DP rank: ranks (0,1) form dp 0, ranks (2,3) form dp 1; the even rank collects."""

    def __init__(self, tp_size: int = 2) -> None:
        dp_rank = self.rank // tp_size
        self.register_mesh("rollout", dp_rank=dp_rank, dp_size=self.world_size // tp_size, is_collect=self.rank % tp_size == 0)
        self.seen: list[list[int]] = []

    @register(dispatch=Dispatch.DP_MESH, mesh="rollout")
    def generate(self, data: DataProto) -> DataProto:
        self.seen.append(data.batch["x"].tolist())
        return DataProto.from_dict(tensors={"x": data.batch["x"], "by": torch.full((len(data),), self.rank)})

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def seen_rows(self) -> list[list[int]]:
        return self.seen

    @register(dispatch=Dispatch.DP_MESH, mesh="undeclared")
    def bad_mesh(self, data: DataProto) -> DataProto:
        return data


class ConsumerWorker(Worker):
    """Receives chunks produced by another group."""

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO)
    def add_one(self, data: DataProto) -> DataProto:
        return DataProto.from_dict(tensors={"z": data.batch["y"] + 1, "consumer_rank": torch.full((len(data),), self.rank)})
