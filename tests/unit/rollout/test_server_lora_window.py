"""The adapter window of a LoRA server (rollout/server_lora.py): W = staleness + 2 adapters, the oldest non-active
one evicted, names and ids never reused; the payload carries what the tensors are."""

from __future__ import annotations

import pytest
import torch

from verl_like.rollout.server_lora import (
    AdapterEntry,
    AdapterWindow,
    adapter_name,
    adapter_payload,
    payload_metadata,
    server_lora_args,
    window_size,
)


def entry(lora_int_id: int, version: int | None = None) -> AdapterEntry:
    version = lora_int_id if version is None else version
    return AdapterEntry(adapter_name(lora_int_id, version), lora_int_id, version)


def add(window: AdapterWindow, new: AdapterEntry, activate: bool = True) -> list[str]:
    evicted = window.evictions_for(new)
    window.added(new, evicted)
    if activate:
        window.activate(new.name)
    return [e.name for e in evicted]


def test_window_is_staleness_plus_two_and_reaches_the_server_flags():
    assert [window_size(k) for k in (0, 1, 3)] == [2, 3, 5]
    assert server_lora_args(8, 3) == ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "3",
                                      "--max-cpu-loras", "3"]
    assert server_lora_args(12, 2)[2] == "16"  # vLLM's next allowed max_lora_rank


def test_the_oldest_non_active_adapter_is_evicted_once_the_window_is_full():
    window = AdapterWindow(capacity=3)
    assert add(window, entry(1)) == [] and add(window, entry(2)) == [] and add(window, entry(3)) == []
    assert add(window, entry(4)) == ["policy-1-v1"]
    assert [e.name for e in window.loaded] == ["policy-2-v2", "policy-3-v3", "policy-4-v4"]
    assert window.active == entry(4)


def test_the_active_adapter_is_never_evicted_even_when_oldest():
    window = AdapterWindow(capacity=2)
    add(window, entry(1))
    add(window, entry(2), activate=False)  # added, not yet active (another server refused it)
    assert add(window, entry(3), activate=False) == ["policy-2-v2"]
    assert window.active == entry(1) and [e.name for e in window.loaded] == ["policy-1-v1", "policy-3-v3"]


def test_names_and_ids_are_never_reused_even_after_eviction():
    window = AdapterWindow(capacity=2)
    for i in (1, 2, 3):
        add(window, entry(i))
    assert window.next_id == 4
    with pytest.raises(ValueError, match="name 'policy-1-v1' was used before"):
        window.evictions_for(entry(1))
    with pytest.raises(ValueError, match="int id 2 was used before"):
        window.evictions_for(AdapterEntry("policy-2-v9", 2, 9))


def test_evictions_change_nothing_until_the_engine_added_the_adapter():
    window = AdapterWindow(capacity=2)
    add(window, entry(1))
    add(window, entry(2))
    assert window.evictions_for(entry(3)) == [entry(1)]
    assert window.loaded == [entry(1), entry(2)] and window.next_id == 3  # a refused add leaves the window as it was


def test_activating_or_removing_an_unknown_or_active_adapter_is_refused():
    window = AdapterWindow(capacity=3)
    add(window, entry(1))
    with pytest.raises(KeyError, match="not loaded"):
        window.activate("policy-9-v9")
    with pytest.raises(ValueError, match="is the active one"):
        window.remove("policy-1-v1")
    add(window, entry(2))
    assert window.remove("policy-1-v1") == entry(1) and window.status()["loaded"] == ["policy-2-v2"]


def test_a_window_smaller_than_two_is_refused():
    with pytest.raises(ValueError, match="--max-loras"):
        AdapterWindow(capacity=1)


def test_the_payload_carries_name_id_version_and_config_beside_the_tensors():
    from safetensors.torch import load

    tensors = {"base_model.model.layers.0.q_proj.lora_A.weight": torch.randn(8, 16)}
    payload = adapter_payload(tensors, {"r": 8, "lora_alpha": 32}, "policy-5-v3", 5, 3)
    assert payload_metadata(payload) == {"name": "policy-5-v3", "lora_int_id": 5, "version": 3,
                                         "config": {"r": 8, "lora_alpha": 32}}
    assert torch.equal(load(payload)["base_model.model.layers.0.q_proj.lora_A.weight"],
                       tensors["base_model.model.layers.0.q_proj.lora_A.weight"])
    with pytest.raises(ValueError, match="no 'verl_like_adapter' entry"):
        from safetensors.torch import save

        payload_metadata(save(tensors))
