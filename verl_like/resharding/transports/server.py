"""Server transport: the trainer's weights into vLLM servers through vLLM's native weight-transfer API.

Init once: the trainer's rank 0 hosts a TCP store and a process group with every worker of every server
(rank 0 = the sender, server k's workers after those of servers 0..k-1), joined while each server's
POST /init_weight_transfer_engine runs. Per update, on every server: pause → start → update (one POST per bucket,
running while rank 0 broadcasts that bucket) → finish (with the weight version) → resume; resume always follows a
pause. The whole model is never gathered on one device: every trainer rank takes part in gathering one parameter
at a time from the FSDP shards, and rank 0 holds at most one bucket. A failed update tears the group down; the
next update builds it again.

Two links carry the buckets (`rollout.server.weight_transfer`, resolved by config/placement.py):
- gloo: a gloo group of rank 0 and every server worker, joined at init; the servers run our gloo engine
  (`verl_like.rollout.server_extension`), on GPUs through host memory.
- ipc: vLLM's own CUDA-IPC engine, for servers on rank 0's GPU (checked by GPU UUID at init). Rank 0 packs each
  bucket into one uint8 buffer on its GPU and posts a pickled IPC handle of it; the server's workers map the buffer,
  copy the tensors out and answer; the buffer is dropped only after every server has answered. Request shapes per
  vLLM release come from `rollout/vllm_compat.py`.
What each request carries is the servers' `ServerBackend` (rollout/server_backend.py: vLLM's, rollout/vllm_server.py).
Servers receive full tensors and each worker's vLLM loader keeps its own TP slice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.multiprocessing.reductions import reduce_tensor

from verl_like.engine.base import TrainEngine
from verl_like.utils.gloo import free_port, gloo_group
from verl_like.resharding.transfer import SyncStats
from verl_like.resharding.transports.base import WeightTransport
from verl_like.rollout.server_backend import ServerBackend
from verl_like.rollout.server_client import ServerClient, ServerError

logger = logging.getLogger(__name__)

STORE_PREFIX = "verl_like_weights"  # what verl_like.rollout.server_extension joins under


@dataclass(frozen=True)
class ServerTransportOptions:
    """bucket_bytes: most bytes per broadcast. timeout_s: bound of every HTTP call and collective wait.
    backend: the servers' protocol (rollout/server_backend.py; None: vLLM's).
    pause_mode: what in-flight requests do during the update ("abort" ends them, "keep" freezes them).
    address: where the servers reach this trainer's rank 0. wire_dtype: the servers' weight dtype.
    weight_transfer: the link, "gloo" or "ipc" (module doc). reset_encoder_cache: drop the servers' cached vision
    embeddings after each update (a vision-language model: they are keyed by image, not by the weights of the
    tower and connector that computed them; vLLM 0.32's pause clears them as well, releases before may not)."""

    bucket_bytes: int
    timeout_s: float
    backend: ServerBackend | None = None
    pause_mode: str = "abort"
    address: str = "127.0.0.1"
    wire_dtype: torch.dtype = torch.float32
    weight_transfer: str = "gloo"
    reset_encoder_cache: bool = False


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


def _raise_first(futures: list[Future]) -> None:
    """Waits for every future; raises the first failure (each names its server)."""
    errors = [future.exception() for future in futures]
    for error in errors:
        if error is not None:
            raise error


class _GlooLink:
    """Buckets over a gloo group of rank 0 (this process, the store's host) and every server worker."""

    def __init__(self, clients: list[ServerClient], options: ServerTransportOptions, pool: ThreadPoolExecutor) -> None:
        self.clients, self.options, self.pool = clients, options, pool
        self.group = None

    def connect(self) -> None:
        opts = self.options
        sizes = [client.world_size() for client in self.clients]
        world = 1 + sum(sizes)
        port = free_port(opts.address)
        futures, offset = [], 1
        for client, size in zip(self.clients, sizes):
            info = client.backend.gloo_init_info(master_address=opts.address, master_port=port, rank_offset=offset,
                                                 world_size=world, timeout_s=opts.timeout_s)
            futures.append(self.pool.submit(client.init_weight_transfer, info, opts.timeout_s))
            offset += size
        try:
            self.group = gloo_group(opts.address, port, 0, world, opts.timeout_s, STORE_PREFIX)
        except Exception as err:
            _raise_first(futures)  # a server's own error names it; else the rendezvous failed here
            raise ServerError(
                f"weight transfer: the servers {self.clients} did not join rank 0's group at {opts.address}:{port} "
                f"within {opts.timeout_s:.0f} s ({err})"
            ) from err
        _raise_first(futures)
        logger.info("weight transfer (gloo): trainer rank 0 + %d server workers (%s)", world - 1, self.clients)

    def send_bucket(self, bucket: list[tuple[str, torch.Tensor]]) -> int:
        flat = torch.cat([tensor.reshape(-1) for _, tensor in bucket]).cpu()  # gloo moves host memory
        names = [name for name, _ in bucket]
        shapes = [list(tensor.shape) for _, tensor in bucket]
        dtype_name = str(flat.dtype).removeprefix("torch.")
        posts = [self.pool.submit(client.update_weights, client.backend.gloo_update_info(names, shapes, dtype_name),
                                  self.options.timeout_s) for client in self.clients]
        work = self.group.broadcast(flat, 0)
        _raise_first(posts)
        work.wait()
        return flat.numel() * flat.element_size()

    def finish_round(self) -> None:
        pass

    def drop(self) -> None:
        self.group = None


class _IpcLink:
    """Buckets as CUDA-IPC handles of one buffer on rank 0's GPU, for servers whose workers share that GPU."""

    def __init__(self, clients: list[ServerClient], options: ServerTransportOptions, pool: ThreadPoolExecutor) -> None:
        self.clients, self.options, self.pool = clients, options, pool
        self.versions: list[str] = []
        self.device: torch.device | None = None
        self.gpu_uuid = ""

    def connect(self) -> None:
        if not torch.cuda.is_available():
            raise ServerError("actor_rollout_ref.rollout.server.weight_transfer=ipc needs CUDA, and the trainer's "
                              "rank 0 sees no GPU; use weight_transfer=gloo")
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.gpu_uuid = str(torch.cuda.get_device_properties(self.device).uuid)
        for client in self.clients:
            try:
                uuids = client.backend.gpu_uuids(client.send(client.backend.gpu_uuid_request()))
            except ServerError as err:
                raise ServerError(f"weight_transfer=ipc: {client} did not say which GPU it runs on (is it a "
                                  f"`python -m verl_like.serve --weight-transfer ipc` server?): {err}") from err
            others = sorted({uuid for uuid in uuids if uuid != self.gpu_uuid})
            if others:
                raise ServerError(f"weight_transfer=ipc: {client} has workers on GPU {others}, not on the trainer's "
                                  f"rank-0 GPU {self.gpu_uuid}; CUDA IPC needs the same GPU: use weight_transfer=gloo")
        self.versions = [client.version() for client in self.clients]
        futures = [self.pool.submit(client.init_weight_transfer, client.backend.ipc_init_info(version),
                                    self.options.timeout_s) for client, version in zip(self.clients, self.versions)]
        _raise_first(futures)
        logger.info("weight transfer (ipc): %s on GPU %s (vLLM %s)", self.clients, self.gpu_uuid, self.versions)

    def send_bucket(self, bucket: list[tuple[str, torch.Tensor]]) -> int:
        sizes = [tensor.numel() * tensor.element_size() for _, tensor in bucket]
        buffer = torch.empty(sum(sizes), dtype=torch.uint8, device=self.device)
        offset = 0
        for (_, tensor), size in zip(bucket, sizes):
            buffer[offset : offset + size].copy_(tensor.contiguous().view(-1).view(torch.uint8))
            offset += size
        torch.cuda.current_stream(self.device).synchronize()  # the servers read the whole bucket at once
        _, handle = reduce_tensor(buffer)
        handles = {self.gpu_uuid: handle}
        names = [name for name, _ in bucket]
        dtype_names = [str(tensor.dtype).removeprefix("torch.") for _, tensor in bucket]
        shapes = [list(tensor.shape) for _, tensor in bucket]
        posts = [
            self.pool.submit(client.update_weights,
                             client.backend.ipc_update_info(version, names, dtype_names, shapes, sizes, handles),
                             self.options.timeout_s)
            for client, version in zip(self.clients, self.versions)
        ]
        _raise_first(posts)  # every server has copied the bucket out of `buffer`: only now may it go
        del buffer
        torch.cuda.ipc_collect()  # frees the buffers the servers have released
        return sum(sizes)

    def finish_round(self) -> None:
        torch.cuda.ipc_collect()  # 0.32's servers release their last mapping at finish

    def drop(self) -> None:
        self.versions = []


class WeightSender:
    """Rank 0's link to the servers and the four-phase update round (no training engine)."""

    def __init__(self, clients: list[ServerClient], options: ServerTransportOptions) -> None:
        if options.weight_transfer not in ("gloo", "ipc"):
            raise ValueError(f"weight_transfer={options.weight_transfer!r} must be 'gloo' or 'ipc' (auto is resolved "
                             "by config/placement.py:RolloutPlacement.weight_transfer)")
        self.clients = clients
        self.options = options
        self._pool = ThreadPoolExecutor(max_workers=max(2, len(clients)), thread_name_prefix="weight-http")
        link = _IpcLink if options.weight_transfer == "ipc" else _GlooLink
        self.link: _GlooLink | _IpcLink = link(clients, options, self._pool)
        self.connected = False

    def _on_every_server(self, call, *args) -> None:
        """Runs `call(client, *args)` on every server at once; raises the first failure (naming its server)."""
        _raise_first([self._pool.submit(call, client, *args) for client in self.clients])

    def connect(self) -> None:
        """Links rank 0 (this process) with every server's workers."""
        self.link.connect()
        self.connected = True

    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> tuple[int, int]:
        """One update round from the stream of full tensors; returns (bytes sent, buckets)."""
        if not self.connected:
            self.connect()
        opts = self.options
        sent = buckets = 0
        self._on_every_server(ServerClient.pause, opts.pause_mode)
        try:
            self._on_every_server(ServerClient.start_weight_update)
            for bucket in _buckets(((n, t.to(opts.wire_dtype)) for n, t in named_tensors), opts.bucket_bytes):
                sent += self.link.send_bucket(bucket)
                buckets += 1
            self._on_every_server(ServerClient.finish_weight_update, version)
            self.link.finish_round()
            if opts.reset_encoder_cache:  # before resume: no request may meet an embedding of the old weights
                self._on_every_server(ServerClient.reset_encoder_cache)
        except BaseException:
            # A broken round leaves the servers' side unknown: connect again next time.
            self.connected = False
            self.link.drop()
            raise
        finally:
            self._on_every_server(ServerClient.resume)
        return sent, buckets

    def close(self) -> None:
        self.connected = False
        self.link.drop()
        self._pool.shutdown(wait=False, cancel_futures=True)


class ServerTransport(WeightTransport):
    """Every trainer rank gathers full tensors from its FSDP shards together; rank 0 sends them to the servers."""

    def __init__(self, engine: TrainEngine, addresses: list[str], options: ServerTransportOptions,
                 state_iterator: Callable[[], Iterator[tuple[str, torch.Tensor]]] | None = None,
                 send_static_once: bool = False) -> None:
        """state_iterator: the (name, full tensor) stream one round sends, a collective (default: the engine's
        `full_state_iterator`; the adapter transport sends the LoRA base, server_adapter.py). send_static_once:
        the engine's static weights (`TrainEngine.static_weight_names`, a frozen vision tower) go with this link's
        first round only (servers keep their weights; a restarted server is linked anew)."""
        self.engine = engine
        self.options = options
        self.state_iterator = state_iterator or engine.full_state_iterator
        self.send_static_once = send_static_once and state_iterator is None
        self._sent = False
        self.sender: WeightSender | None = None
        if dist.get_rank() == 0:  # global rank 0: with model parallelism several ranks are DP rank 0
            clients = [ServerClient(a, f"server {i}", timeout_s=options.timeout_s, backend=options.backend)
                       for i, a in enumerate(addresses)]
            self.sender = WeightSender(clients, options)
            self.sender.connect()

    def send(self, version: int) -> SyncStats:
        """This rank's stats; model_bytes (`sync/bytes`) on every rank, in the wire dtype (the mean over ranks is the
        sync's, not rank 0's share of it), sent_bytes on rank 0 only."""
        start = time.perf_counter()
        counted = [0]
        wire_size = torch.empty((), dtype=self.options.wire_dtype).element_size()

        skip = self.engine.static_weight_names() if self.send_static_once and self._sent else frozenset()
        # Set on every rank alike, failed round or not (the ranks' gathers must match): a frozen tower never differs
        # from model.path, which a server loads at start.
        self._sent = True
        state = (lambda: self.engine.full_state_iterator_skipping(skip)) if skip else self.state_iterator

        def counting() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in state():
                counted[0] += tensor.numel() * wire_size
                yield name, tensor

        stream = counting()
        sent = buckets = 0
        try:
            if self.sender is not None:
                sent, buckets = self.sender.send(stream, version)
        finally:
            # Every rank takes part in every gather (a collective): the other ranks send nothing, and rank 0 finishes
            # the stream even when sending failed, so its peers return instead of waiting out the group's timeout.
            for _ in stream:
                pass
        return SyncStats(wall_s=time.perf_counter() - start, model_bytes=counted[0], loaded_bytes=0, received_bytes=0,
                         sent_bytes=sent, buckets=buckets, mode="server")

    @property
    def clients(self) -> list[ServerClient]:
        """The servers' clients on rank 0 (which sends); [] on the other ranks."""
        return self.sender.clients if self.sender is not None else []

    def close(self) -> None:
        if self.sender is not None:
            self.sender.close()
