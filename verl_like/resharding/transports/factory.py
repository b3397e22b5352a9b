"""`build_transport`: the one place that picks how the trainer's weights reach the rollout, for every placement.

`choose_transport` decides (pure: tests/unit/resharding/test_transport_factory.py), `build_transport` builds:
- the rollout in servers (every placement but COLOCATED, config/placement.py; the worker's Topology then has no
  rollout layout and the driver hands it a `ServerLink`): vLLM's weight-transfer round (`ServerTransport`, over
  the link the placement resolved: gloo or ipc), or for an unmerged LoRA policy the base once and then the adapter
  alone (`ServerAdapterTransport`);
- colocated, in this order: a user's `update_rollout_weights` hook (full tensors into it; a LoRA policy's merged);
  no engine (a text hook without a weight hook): None; a LoRA policy and an engine serving adapters: adapter-only
  (`AdapterTransport`); a LoRA policy otherwise (lora.merge=true): merged full tensors (the slice plan speaks plain
  HF names only); sliced when rollout.weight_sync_mode=sliced, the engine loads TP slices and the layout is known;
  else full tensors.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from verl_like.config.rollout import RolloutConfig
from verl_like.engine.base import TrainEngine
from verl_like.resharding.transports.base import WeightTransport
from verl_like.resharding.transports.full import FullTensorTransport
from verl_like.rollout.base import RolloutEngine
from verl_like.shapes.decoder import DecoderShape, UnknownLayoutError

if TYPE_CHECKING:
    from verl_like.resharding.transports.server import ServerTransportOptions

logger = logging.getLogger(__name__)


class TransportKind(enum.Enum):
    HOOK = "hook"  # full tensors into a user's update_rollout_weights
    NONE = "none"  # a text hook without a weight hook: its engine keeps its own weights
    ADAPTER = "adapter"
    MERGED = "merged"
    SLICED = "sliced"
    FULL = "full"
    SERVER = "server"
    SERVER_ADAPTER = "server_adapter"


@dataclass(frozen=True)
class ServerLink:
    """The servers a worker group sends to (the server placements): their addresses, the transport's options
    (the placement's resolved weight_transfer among them) and whether they serve the LoRA adapter (lora_rank)."""

    addresses: tuple[str, ...]
    options: ServerTransportOptions
    serves_adapters: bool = False
    lora_rank: int = 0


def choose_transport(*, servers: bool, lora: bool, serves_adapters: bool = False, hook: bool = False,
                     has_engine: bool = True, engine_adapters: bool = False, sync_mode: str = "sliced",
                     slice_loading: bool = False) -> TransportKind:
    """Which transport (module doc). servers: the rollout is in servers. lora: the policy trains a LoRA adapter.
    serves_adapters: the servers serve it (unmerged). hook / has_engine / engine_adapters / slice_loading: what the
    colocated worker has (a weight hook, a rollout engine, one serving adapters, one loading TP slices).
    sync_mode: rollout.weight_sync_mode. SLICED may still fall back to FULL when the layout is unknown."""
    if servers:
        return TransportKind.SERVER_ADAPTER if lora and serves_adapters else TransportKind.SERVER
    if hook:
        return TransportKind.HOOK
    if not has_engine:
        return TransportKind.NONE
    if lora:
        return TransportKind.ADAPTER if engine_adapters else TransportKind.MERGED
    if sync_mode == "sliced" and slice_loading:
        return TransportKind.SLICED
    return TransportKind.FULL


def build_transport(
    engine: TrainEngine,
    config: RolloutConfig,
    *,
    rollout: RolloutEngine | None = None,
    hf_config: Callable[[], Any] | None = None,
    hook: Callable[[Iterable[tuple[str, torch.Tensor]]], None] | None = None,
    servers: ServerLink | None = None,
) -> WeightTransport | None:
    """The transport from `engine` into this rank's `rollout` (colocated) or into `servers` (module doc).
    hf_config: the policy's HF config (read only for the sliced plan's layout)."""
    kind = choose_transport(
        servers=servers is not None, lora=engine.lora_enabled,
        serves_adapters=servers is not None and servers.serves_adapters, hook=hook is not None,
        has_engine=rollout is not None, engine_adapters=rollout is not None and rollout.supports_adapters,
        sync_mode=config.weight_sync_mode, slice_loading=rollout is not None and rollout.supports_slice_loading,
    )
    if kind is TransportKind.SERVER_ADAPTER:
        from verl_like.resharding.transports.server_adapter import ServerAdapterTransport

        return ServerAdapterTransport(engine, list(servers.addresses), servers.options, servers.lora_rank)
    if kind is TransportKind.SERVER:
        from verl_like.resharding.transports.server import ServerTransport

        # A frozen vision tower goes to the servers once per link (they keep their weights).
        return ServerTransport(engine, list(servers.addresses), servers.options, send_static_once=True)
    if kind is TransportKind.HOOK:
        return FullTensorTransport(engine, hook, mode="hook")
    if kind is TransportKind.NONE:
        return None
    if kind is TransportKind.ADAPTER:
        from verl_like.resharding.transports.adapter import AdapterTransport

        return AdapterTransport(engine, rollout)
    if kind is TransportKind.MERGED:
        return FullTensorTransport(engine, rollout.load_weights, mode="merged")
    if kind is TransportKind.SLICED:
        from verl_like.resharding.transports.colocated_sliced import SlicedTransport

        try:
            shape = DecoderShape.from_hf_config(hf_config())
            return SlicedTransport(engine, rollout, shape, config.bucket_bytes, config.weight_sync_timeout_s)
        except UnknownLayoutError as err:
            logger.warning("sliced weight sync unavailable (%s); syncing full tensors through vLLM's loader", err)
    # A frozen vision tower goes to vLLM once, unless the engine's sleep throws its weights away.
    return FullTensorTransport(engine, rollout.load_weights, send_static_once=not rollout.sleep_discards_weights)


def server_transport_options(config: RolloutConfig, engine: TrainEngine, *, address: str, pause_mode: str | None,
                             weight_transfer: str, vision: bool, backend: Any = None) -> ServerTransportOptions:
    """The ServerTransportOptions of the rollout node: its buckets, timeouts and dtype ("auto": the trainer's
    parameter dtype), rank 0's `address`, the update's `pause_mode` (None: rollout.server.pause_mode), the link the
    placement resolved, the servers' protocol (`backend`, rollout/server_backend.py) and, for a vision model,
    dropping the servers' encoder cache after each update."""
    from verl_like.resharding.transports.server import ServerTransportOptions

    wire_dtype = engine.config.param_dtype if config.dtype == "auto" else getattr(torch, config.dtype)
    return ServerTransportOptions(
        bucket_bytes=config.bucket_bytes, timeout_s=config.server.request_timeout_s,
        pause_mode=pause_mode or config.server.pause_mode, address=address, wire_dtype=wire_dtype,
        weight_transfer=weight_transfer, reset_encoder_cache=vision, backend=backend,
    )
