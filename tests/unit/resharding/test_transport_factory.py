"""build_transport picks the weight transport in one place, for every placement: the servers' round (or the LoRA
adapter into them), else hook, adapter-only, merged, sliced, full."""

from __future__ import annotations

import pytest

from verl_like.config.rollout import RolloutConfig
from verl_like.resharding.transports.adapter import AdapterTransport
import torch

from verl_like.config.placement import PlacementKind, RolloutPlacement
from verl_like.resharding.transports.factory import (
    ServerLink,
    TransportKind,
    build_transport,
    choose_transport,
    server_transport_options,
)
from verl_like.resharding.transports.full import FullTensorTransport


class Engine:
    """What the factory reads of a TrainEngine."""

    def __init__(self, lora: bool) -> None:
        self.lora_enabled = lora
        self.config = type("EngineConfig", (), {"param_dtype": torch.bfloat16})()


class Rollout:
    """What the factory reads of a RolloutEngine."""

    def __init__(self, adapters: bool, slices: bool = True) -> None:
        self.supports_adapters = adapters
        self.supports_slice_loading = slices
        self.sleep_discards_weights = False

    def load_weights(self, named_tensors) -> None:
        pass


def no_layout():
    raise AssertionError("the sliced plan's layout is not read on this path")


@pytest.mark.parametrize(("lora", "adapters", "mode", "expected"), [
    (True, True, "sliced", AdapterTransport),       # LoRA, an engine serving adapters: the adapter alone
    (True, False, "sliced", FullTensorTransport),   # lora.merge=true (or an engine without adapters): merged
    (False, False, "full", FullTensorTransport),
])
def test_the_transport_follows_the_engines(lora, adapters, mode, expected):
    transport = build_transport(Engine(lora), RolloutConfig(weight_sync_mode=mode), rollout=Rollout(adapters),
                                hf_config=no_layout)
    assert type(transport) is expected
    if lora and not adapters:
        assert transport.mode == "merged"


def test_a_user_hook_wins_and_a_text_hook_without_an_engine_gets_none():
    def hook(named_tensors):
        pass

    transport = build_transport(Engine(True), RolloutConfig(), rollout=Rollout(True), hf_config=no_layout, hook=hook)
    assert type(transport) is FullTensorTransport and transport.mode == "hook"
    assert build_transport(Engine(False), RolloutConfig(), hf_config=no_layout) is None


def test_sliced_is_tried_for_a_full_model_and_falls_back_on_an_unknown_layout():
    from verl_like.shapes.layout import UnknownLayoutError

    def unknown():
        raise UnknownLayoutError("a layout the plan does not know")

    transport = build_transport(Engine(False), RolloutConfig(), rollout=Rollout(True), hf_config=unknown)
    assert type(transport) is FullTensorTransport and transport.mode == "full"


def placement(kind: PlacementKind) -> RolloutPlacement:
    return RolloutPlacement(kind, tp_size=1, servers=0 if kind is PlacementKind.COLOCATED else 1,
                            gpu_fraction=0.5 if kind is PlacementKind.TRAINER_DEVICES else 0.0)


@pytest.mark.parametrize(("kind", "lora", "serves_adapters", "expected"), [
    (PlacementKind.COLOCATED, False, False, TransportKind.SLICED),
    (PlacementKind.COLOCATED, True, True, TransportKind.ADAPTER),
    (PlacementKind.OWN_POOL, False, False, TransportKind.SERVER),
    (PlacementKind.OWN_POOL, True, True, TransportKind.SERVER_ADAPTER),
    (PlacementKind.OWN_POOL, True, False, TransportKind.SERVER),  # lora.merge=true: merged weights into servers
    (PlacementKind.TRAINER_DEVICES, False, False, TransportKind.SERVER),
    (PlacementKind.USER_SERVERS, True, True, TransportKind.SERVER_ADAPTER),
])
def test_the_choice_follows_the_placement_kind(kind, lora, serves_adapters, expected):
    chosen = choose_transport(servers=placement(kind).uses_servers, lora=lora, serves_adapters=serves_adapters,
                              engine_adapters=serves_adapters, slice_loading=True)
    assert chosen is expected


def test_colocated_choices_without_servers():
    assert choose_transport(servers=False, lora=False, hook=True) is TransportKind.HOOK
    assert choose_transport(servers=False, lora=False, has_engine=False) is TransportKind.NONE
    assert choose_transport(servers=False, lora=True, engine_adapters=False) is TransportKind.MERGED
    assert choose_transport(servers=False, lora=False, slice_loading=False) is TransportKind.FULL  # HF generate
    assert choose_transport(servers=False, lora=False, sync_mode="full", slice_loading=True) is TransportKind.FULL


class Recorded:
    """Stands in for a server transport (the real one links rank 0 to the servers at construction)."""

    def __init__(self, *args, **kwargs) -> None:
        self.args, self.kwargs = args, kwargs


def test_servers_get_the_round_or_the_adapter_built_from_the_link(monkeypatch):
    from verl_like.resharding.transports import server, server_adapter

    monkeypatch.setattr(server, "ServerTransport", Recorded)
    monkeypatch.setattr(server_adapter, "ServerAdapterTransport", Recorded)
    config = RolloutConfig(mode="server", dtype="auto")
    options = server_transport_options(config, Engine(False), address="10.0.0.2", pause_mode=None,
                                       weight_transfer=placement(PlacementKind.TRAINER_DEVICES).weight_transfer("cuda"),
                                       vision=False)
    assert (options.weight_transfer, options.pause_mode, options.wire_dtype) == ("ipc", "abort", torch.bfloat16)
    link = ServerLink(("http://a:1", "http://b:2"), options)
    full = build_transport(Engine(False), config, servers=link)
    assert full.args[1:] == (["http://a:1", "http://b:2"], options)
    assert full.kwargs == {"send_static_once": True}
    adapter = build_transport(Engine(True), config, servers=ServerLink(link.addresses, options, True, 8))
    assert adapter.args[1:] == (["http://a:1", "http://b:2"], options, 8)
