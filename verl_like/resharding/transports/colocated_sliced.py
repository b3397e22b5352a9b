"""Colocated sliced transport (the hybrid engine): each rollout TP rank receives only its slices, bucketed."""

from __future__ import annotations

from verl_like.engine.base import TrainEngine
from verl_like.shapes.decoder import DecoderShape
from verl_like.resharding.sync import SlicedWeightSync, new_sync_group
from verl_like.resharding.transfer import SyncStats
from verl_like.resharding.transports.base import WeightTransport
from verl_like.rollout.base import RolloutEngine


class SlicedTransport(WeightTransport):
    """Plans once per run (`SlicedWeightSync`); every trainer rank is also a rollout TP rank of its own engine.

    Needs an engine that loads TP slices (`RolloutEngine.supports_slice_loading`) and a layout the plan knows
    (`DecoderShape`); `shapes.layout.UnknownLayoutError` otherwise, and the worker falls back to full tensors.
    """

    def __init__(self, engine: TrainEngine, rollout: RolloutEngine, shape: DecoderShape, bucket_bytes: int,
                 timeout_s: float) -> None:
        self.sync = SlicedWeightSync(engine, rollout, shape, bucket_bytes, timeout_s, new_sync_group(timeout_s))

    def send(self, version: int) -> SyncStats:
        return self.sync()
