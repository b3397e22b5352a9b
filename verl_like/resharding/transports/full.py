"""Full-tensor transport: parameters gathered one at a time from the shards, into a loader of full tensors.

The reference path (vLLM narrows each tensor to its TP slice itself), the fallback for layouts the sliced plan
does not know, and the path of a user's `ActorRolloutWorker.update_rollout_weights` hook.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

import torch

from verl_like.engine.base import TrainEngine
from verl_like.resharding.transfer import SyncStats
from verl_like.resharding.transports.base import WeightTransport
from verl_like.rollout.base import RolloutEngine

Loader = Callable[[Iterable[tuple[str, torch.Tensor]]], None]


class FullTensorTransport(WeightTransport):
    """`load(stream of (HF name, full tensor))` on every rank; `mode` labels the metrics ("full" or "hook").

    send_static_once: the engine's static weights (`TrainEngine.static_weight_names`, a frozen vision tower) go
    with the first send only; later sends leave them out (neither gathered nor loaded). Only for a loader that
    keeps what it was given (an engine whose sleep discards its weights needs them every time).
    """

    def __init__(self, engine: TrainEngine, load: Loader, mode: str = "full", send_static_once: bool = False) -> None:
        self.engine = engine
        self.load = load
        self.mode = mode
        self.send_static_once = send_static_once
        self._sent = False

    def send(self, version: int) -> SyncStats:
        start = time.perf_counter()
        counted = [0]
        skip = self.engine.static_weight_names() if self.send_static_once and self._sent else frozenset()

        def stream() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in self.engine.full_state_iterator_skipping(skip):
                counted[0] += tensor.numel() * tensor.element_size()
                yield name, tensor

        tensors = stream()
        self.load(tensors)
        for _ in tensors:  # the stream is a collective: finish it even if the loader stopped early
            pass
        self._sent = True
        world = self.engine.dp_size
        gathered = counted[0] * (world - 1) // world  # what the per-parameter all-gathers moved
        return SyncStats(wall_s=time.perf_counter() - start, model_bytes=counted[0], loaded_bytes=counted[0],
                         received_bytes=gathered, sent_bytes=gathered, buckets=1, mode=self.mode)


def full_weight_sync(engine: TrainEngine, rollout: RolloutEngine) -> SyncStats:
    """Full tensors (gathered one at a time) through the rollout engine's own `load_weights`; the reference path.

    Collective over the trainer's group; waits follow that group's timeout.
    """
    return FullTensorTransport(engine, rollout.load_weights).send(engine.global_step)
