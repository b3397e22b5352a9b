"""build_colocated_transport picks the colocated transport in one place: hook, adapter-only, merged, sliced, full."""

from __future__ import annotations

import pytest

from verl_like.config.rollout import RolloutConfig
from verl_like.resharding.transports.adapter import AdapterTransport
from verl_like.resharding.transports.factory import build_colocated_transport
from verl_like.resharding.transports.full import FullTensorTransport


class Engine:
    """What the factory reads of a TrainEngine."""

    def __init__(self, lora: bool) -> None:
        self.lora_enabled = lora


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
    transport = build_colocated_transport(Engine(lora), Rollout(adapters), RolloutConfig(weight_sync_mode=mode),
                                          no_layout)
    assert type(transport) is expected
    if lora and not adapters:
        assert transport.mode == "merged"


def test_a_user_hook_wins_and_a_text_hook_without_an_engine_gets_none():
    def hook(named_tensors):
        pass

    transport = build_colocated_transport(Engine(True), Rollout(True), RolloutConfig(), no_layout, hook=hook)
    assert type(transport) is FullTensorTransport and transport.mode == "hook"
    assert build_colocated_transport(Engine(False), None, RolloutConfig(), no_layout) is None


def test_sliced_is_tried_for_a_full_model_and_falls_back_on_an_unknown_layout():
    from verl_like.shapes.layout import UnknownLayoutError

    def unknown():
        raise UnknownLayoutError("a layout the plan does not know")

    transport = build_colocated_transport(Engine(False), Rollout(False), RolloutConfig(), unknown)
    assert type(transport) is FullTensorTransport and transport.mode == "full"
