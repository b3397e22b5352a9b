"""Adapter-only transport into our vLLM servers (LoRA, server mode): the frozen base once, then the adapter alone.

The first sync (and the first after a relink or a discarding sleep) sends the base weights through the servers'
full-weight round (`ServerTransport` streaming `base_state_iterator`). Every sync then posts the adapter's tensors as
safetensors bytes to every server (`POST /verl_like/adapter`, rollout/server_lora.py), which builds the adapter in
its engine from memory under a new name `policy-<id>-v<version>`. All servers or none: the new adapter is added on
every server first, and only then made the active one on each; a server that refuses leaves the old version active
everywhere (the new one is removed where it was added) and the step fails naming the server and the adapter.
Requests in flight keep the version they carry (each server keeps a window of them). Every rank counts the bytes
(the gathers are collectives), so `sync/bytes` averaged over ranks is the sync's, not rank 0's share of it.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from verl_like.engine.base import TrainEngine
from verl_like.resharding.transfer import SyncStats
from verl_like.resharding.transports.base import WeightTransport
from verl_like.resharding.transports.server import ServerTransport, ServerTransportOptions
from verl_like.rollout import server_lora
from verl_like.rollout.server_client import ServerClient, ServerError

logger = logging.getLogger(__name__)


def check_lora_servers(clients: list[ServerClient], lora_rank: int, window: int = 2) -> tuple[int, str | None]:
    """ServerError naming the first server that cannot hold `window` adapters of `lora_rank` (started without LoRA,
    a rank or window too small: a user's server at rollout.server.address); else the first adapter int id unused on
    every server, and the adapter the first server serves (None: the base weights)."""
    next_id, active = 1, None
    for client in clients:
        status = server_lora.adapter_status(client)
        flags = " ".join(server_lora.server_lora_args(lora_rank, window))
        fix = (f"start it with `python -m verl_like.serve MODEL {flags}` "
               "(--max-loras = async_training.staleness + 2), or serve merged weights with "
               "actor_rollout_ref.model.lora.merge=true")
        if not status.get("enabled"):
            raise ServerError(f"{client} serves no LoRA adapters (it was not started with --enable-lora, or is not a "
                              f"verl_like.serve server): adapter-only sync of lora_rank={lora_rank} needs them; {fix}")
        if int(status["max_lora_rank"]) < lora_rank or int(status["max_loras"]) < window:
            raise ServerError(f"{client} holds adapters of rank <= {status['max_lora_rank']}, {status['max_loras']} at "
                              f"a time: lora_rank={lora_rank} needs --max-lora-rank >= {lora_rank} and a window of "
                              f">= {window} (--max-loras, --max-cpu-loras); {fix}")
        next_id = max(next_id, int(status["next_id"]))
        active = active or status.get("active")
    return next_id, active


class AdapterPublisher:
    """Rank 0's side: one adapter version onto every server, all or none (module doc)."""

    def __init__(self, clients: list[ServerClient], lora_rank: int, timeout_s: float) -> None:
        self.clients = clients
        self.timeout_s = timeout_s
        self._next_id, self.active = check_lora_servers(clients, lora_rank)
        self._pool = ThreadPoolExecutor(max_workers=max(2, len(clients)), thread_name_prefix="adapter-http")

    def publish(self, tensors: dict[str, torch.Tensor], adapter_config: dict, version: int) -> str:
        """Adds the adapter of `version` on every server, then activates it on every server; returns its name."""
        lora_int_id = self._next_id
        self._next_id += 1  # never reused, also after a refusal
        name = server_lora.adapter_name(lora_int_id, version)
        payload = server_lora.adapter_payload(tensors, adapter_config, name, lora_int_id, version)
        futures = [self._pool.submit(server_lora.add_adapter, client, payload, self.timeout_s)
                   for client in self.clients]
        errors = [future.exception() for future in futures]
        failed = [(client, error) for client, error in zip(self.clients, errors) if error is not None]
        if failed:
            for client, error in zip(self.clients, errors):
                if error is None:
                    try:
                        server_lora.remove_adapter(client, name)
                    except ServerError as err:  # its window evicts it in time
                        logger.warning("%s: removing the refused adapter %s failed: %s", client, name, err)
            client, error = failed[0]
            raise ServerError(
                f"adapter sync: {client} (server index {self.clients.index(client)}) refused adapter {name} "
                f"(version {version}): {error}; every server keeps serving {self.active or 'the previous weights'}"
            ) from error
        for client in self.clients:
            server_lora.activate_adapter(client, name)
        self.active = name
        return name

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class ServerAdapterTransport(WeightTransport):
    """`engine` trains a LoRA adapter; the servers at `addresses` were started with `server_lora_args`."""

    def __init__(self, engine: TrainEngine, addresses: list[str], options: ServerTransportOptions,
                 lora_rank: int) -> None:
        if not engine.lora_enabled:
            raise ValueError("ServerAdapterTransport needs a LoRA training engine")
        self.engine = engine
        self.base = ServerTransport(engine, addresses, options, state_iterator=engine.base_state_iterator)
        self.publisher = None
        if self.base.sender is not None:  # rank 0
            self.publisher = AdapterPublisher(self.base.clients, lora_rank, options.timeout_s)
        self._base_sent = False

    def send(self, version: int) -> SyncStats:
        start = time.perf_counter()
        base_bytes = buckets = 0
        if not self._base_sent:
            base = self.base.send(version)  # counted on every rank
            base_bytes, buckets, self._base_sent = base.model_bytes, base.buckets, True
        adapter = self.engine.adapter_state()  # a collective: every rank
        adapter_bytes = sum(tensor.numel() * tensor.element_size() for tensor in adapter.values())
        if self.publisher is not None:
            self.publisher.publish(adapter, self.engine.adapter_config(), version)
        moved = base_bytes + adapter_bytes
        sent = moved if self.publisher is not None else 0
        return SyncStats(wall_s=time.perf_counter() - start, model_bytes=moved, loaded_bytes=0, received_bytes=0,
                         sent_bytes=sent, buckets=buckets + 1, mode="adapter", adapter_bytes=adapter_bytes)

    @property
    def clients(self) -> list[ServerClient]:
        """The servers' clients on rank 0; [] elsewhere."""
        return self.base.clients

    @property
    def adapter_name(self) -> str | None:
        """The adapter every server serves (rank 0; None elsewhere and before the first sync)."""
        return self.publisher.active if self.publisher is not None else None

    def forget_engine_weights(self) -> None:
        self._base_sent = False

    def close(self) -> None:
        if self.publisher is not None:
            self.publisher.close()
        self.base.close()
