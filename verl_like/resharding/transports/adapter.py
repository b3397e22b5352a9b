"""Adapter-only transport (LoRA, colocated): the frozen base weights once, then the adapter's tensors alone.

The in-process engine takes the adapter from memory (`RolloutEngine.load_adapter`; vLLM: rollout/vllm_lora.py)
under a new name and id per version; nothing touches disk. The tensors are copies gathered from the shards
(`TrainEngine.adapter_state`), never the trainer's own parameters: vLLM scales them in place.
"""

from __future__ import annotations

import time

from verl_like.engine.base import TrainEngine
from verl_like.resharding.transfer import SyncStats
from verl_like.resharding.transports.base import WeightTransport
from verl_like.rollout.base import RolloutEngine


class AdapterTransport(WeightTransport):
    """`engine` trains a LoRA adapter; `rollout` serves adapters (`supports_adapters`)."""

    def __init__(self, engine: TrainEngine, rollout: RolloutEngine) -> None:
        if not engine.lora_enabled or not rollout.supports_adapters:
            raise ValueError("AdapterTransport needs a LoRA training engine and a rollout engine that serves adapters")
        self.engine = engine
        self.rollout = rollout
        self._base_sent = False

    def send(self, version: int) -> SyncStats:
        start = time.perf_counter()
        base_bytes = 0
        if not self._base_sent:
            counted = [0]

            def stream():
                for name, tensor in self.engine.base_state_iterator():
                    counted[0] += tensor.numel() * tensor.element_size()
                    yield name, tensor

            tensors = stream()
            self.rollout.load_weights(tensors)
            for _ in tensors:  # a collective: finish it even if the loader stopped early
                pass
            base_bytes = counted[0]
            self._base_sent = True
        adapter = self.engine.adapter_state()
        adapter_bytes = sum(tensor.numel() * tensor.element_size() for tensor in adapter.values())
        self.rollout.load_adapter(adapter, self.engine.adapter_config(), version)
        moved = base_bytes + adapter_bytes
        world = self.engine.dp_size
        gathered = moved * (world - 1) // world
        return SyncStats(wall_s=time.perf_counter() - start, model_bytes=moved, loaded_bytes=moved,
                         received_bytes=gathered, sent_bytes=gathered, buckets=1, mode="adapter",
                         adapter_bytes=adapter_bytes)

    def forget_engine_weights(self) -> None:
        self._base_sent = False
