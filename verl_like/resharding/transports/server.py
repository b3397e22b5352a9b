"""Server transport: the trainer's weights into vLLM servers through vLLM's native weight-transfer API.

Init once: the trainer's rank 0 hosts a TCP store and a process group with every worker of every server
(rank 0 = the sender, server k's workers after those of servers 0..k-1), joined while each server's
POST /init_weight_transfer_engine runs. Per update, on every server: pause → start → update (one POST per bucket,
running while rank 0 broadcasts that bucket) → finish (with the weight version) → resume; resume always follows a
pause. The whole model is never gathered on one device: every trainer rank takes part in gathering one parameter
at a time from the FSDP shards, and rank 0 holds at most one bucket. A failed update tears the group down; the
next update builds it again.

The group is gloo and the servers run our gloo engine (`verl_like.rollout.server_extension`), on GPUs through host
memory; servers receive full tensors and each worker's vLLM loader keeps its own TP slice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch
import torch.distributed as dist

from verl_like.engine.base import TrainEngine
from verl_like.resharding.gloo import free_port, gloo_group
from verl_like.resharding.transfer import SyncStats
from verl_like.resharding.transports.base import WeightTransport
from verl_like.rollout.server_client import ServerClient, ServerError

logger = logging.getLogger(__name__)

STORE_PREFIX = "verl_like_weights"  # what verl_like.rollout.server_extension joins under
GLOO_BACKEND = "verl_like_gloo"


@dataclass(frozen=True)
class ServerTransportOptions:
    """bucket_bytes: most bytes per broadcast. timeout_s: bound of every HTTP call and collective wait.
    pause_mode: what in-flight requests do during the update ("abort" ends them, "keep" freezes them).
    address: where the servers reach this trainer's rank 0. wire_dtype: the servers' weight dtype."""

    bucket_bytes: int
    timeout_s: float
    pause_mode: str = "abort"
    address: str = "127.0.0.1"
    wire_dtype: torch.dtype = torch.float32


def _buckets(named: Iterable[tuple[str, torch.Tensor]], limit: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > limit:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


class WeightSender:
    """Rank 0's link to the servers: the process group and the four-phase update round (no training engine)."""

    def __init__(self, clients: list[ServerClient], options: ServerTransportOptions) -> None:
        self.clients = clients
        self.options = options
        self.group = None
        self._pool = ThreadPoolExecutor(max_workers=max(2, len(clients)), thread_name_prefix="weight-http")

    def _on_every_server(self, call, *args) -> None:
        """Runs `call(client, *args)` on every server at once; raises the first failure (naming its server)."""
        futures = [self._pool.submit(call, client, *args) for client in self.clients]
        self._raise_first(futures)

    @staticmethod
    def _raise_first(futures: list[Future]) -> None:
        errors = [future.exception() for future in futures]
        for error in errors:
            if error is not None:
                raise error

    def connect(self) -> None:
        """Builds the group: every server's workers join rank 0 (this process)."""
        opts = self.options
        sizes = [client.world_size() for client in self.clients]
        world = 1 + sum(sizes)
        port = free_port(opts.address)
        futures, offset = [], 1
        for client, size in zip(self.clients, sizes):
            info = {"master_address": opts.address, "master_port": port, "rank_offset": offset,
                    "world_size": world, "timeout_s": opts.timeout_s}
            futures.append(self._pool.submit(client.init_weight_transfer, info, opts.timeout_s))
            offset += size
        try:
            self.group = gloo_group(opts.address, port, 0, world, opts.timeout_s, STORE_PREFIX)
        except Exception as err:
            self._raise_first(futures)  # a server's own error names it; else the rendezvous failed here
            raise ServerError(
                f"weight transfer: the servers {self.clients} did not join rank 0's group at {opts.address}:{port} "
                f"within {opts.timeout_s:.0f} s ({err})"
            ) from err
        self._raise_first(futures)
        logger.info("weight transfer group: trainer rank 0 + %d server workers (%s)", world - 1, self.clients)

    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> tuple[int, int]:
        """One update round from the stream of full tensors; returns (bytes sent, buckets)."""
        if self.group is None:
            self.connect()
        opts = self.options
        sent = buckets = 0
        self._on_every_server(ServerClient.pause, opts.pause_mode)
        try:
            self._on_every_server(ServerClient.start_weight_update)
            for bucket in _buckets(((n, t.to(opts.wire_dtype)) for n, t in named_tensors), opts.bucket_bytes):
                sent += self._send_bucket(bucket)
                buckets += 1
            self._on_every_server(ServerClient.finish_weight_update, {"weight_version": str(version)})
        except BaseException:
            self.group = None  # a broken round leaves the servers' side unknown: connect again next time
            raise
        finally:
            self._on_every_server(ServerClient.resume)
        return sent, buckets

    def _send_bucket(self, bucket: list[tuple[str, torch.Tensor]]) -> int:
        flat = torch.cat([tensor.reshape(-1) for _, tensor in bucket]).cpu()  # gloo moves host memory
        info = {
            "names": [name for name, _ in bucket],
            "shapes": [list(tensor.shape) for _, tensor in bucket],
            "dtype_name": str(flat.dtype).removeprefix("torch."),
        }
        posts = [self._pool.submit(client.update_weights, info, self.options.timeout_s) for client in self.clients]
        work = self.group.broadcast(flat, 0)
        try:
            self._raise_first(posts)
        except BaseException:
            self.group = None
            raise
        work.wait()
        return flat.numel() * flat.element_size()

    def close(self) -> None:
        self.group = None
        self._pool.shutdown(wait=False, cancel_futures=True)


class ServerTransport(WeightTransport):
    """Every trainer rank gathers full tensors from its FSDP shards together; rank 0 sends them to the servers."""

    def __init__(self, engine: TrainEngine, addresses: list[str], options: ServerTransportOptions) -> None:
        self.engine = engine
        self.sender: WeightSender | None = None
        if dist.get_rank() == 0:  # global rank 0: with model parallelism several ranks are DP rank 0
            clients = [ServerClient(a, f"server {i}", timeout_s=options.timeout_s) for i, a in enumerate(addresses)]
            self.sender = WeightSender(clients, options)
            self.sender.connect()

    def send(self, version: int) -> SyncStats:
        start = time.perf_counter()
        stream = self.engine.full_state_iterator()
        sent = buckets = 0
        try:
            if self.sender is not None:
                sent, buckets = self.sender.send(stream, version)
        finally:
            # Every rank takes part in every gather (a collective): the other ranks send nothing, and rank 0 finishes
            # the stream even when sending failed, so its peers return instead of waiting out the group's timeout.
            for _ in stream:
                pass
        return SyncStats(wall_s=time.perf_counter() - start, model_bytes=sent, loaded_bytes=0, received_bytes=0,
                         sent_bytes=sent, buckets=buckets, mode="server")

    def close(self) -> None:
        if self.sender is not None:
            self.sender.close()
