"""Colocated sliced transport (the hybrid engine): each rollout TP rank receives only its slices, bucketed.

Each rank receives its TP slices from the ranks holding those rectangles (`TrainEngine.weight_holdings`: FSDP2
rows or Megatron TP/PP shards), in bounded buckets, straight into vLLM's parameters. A collective: every rank of the
trainer's group calls it together.
"""

from __future__ import annotations

import datetime
import logging
import time

import torch
import torch.distributed as dist

from verl_like.engine.base import TrainEngine
from verl_like.resharding.plan import SyncPlan, build_sync_plan, param_specs
from verl_like.resharding.transfer import SlicedTransfer, SyncStats
from verl_like.resharding.transports.base import WeightTransport
from verl_like.rollout.base import RolloutEngine
from verl_like.shapes.decoder import DecoderShape
from verl_like.utils.device import get_torch_device

logger = logging.getLogger(__name__)


class SlicedWeightSync:
    """Plans once (shapes do not change during training) and runs a sliced sync per call.

    `group`: a process group over the trainer's ranks in rank order, created with the sync timeout
    (`new_sync_group`); its waits time out after `timeout_s` and name the rank that did not answer.
    """

    def __init__(
        self,
        engine: TrainEngine,
        rollout: RolloutEngine,
        shape: DecoderShape,
        bucket_bytes: int,
        timeout_s: float,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        self.engine = engine
        self.rollout = rollout
        self.shape = shape
        if not rollout.supports_slice_loading or rollout.weight_dtype is None:
            raise TypeError(f"{type(rollout).__name__} does not load TP slices; use full-tensor loading")
        self.wire_dtype = rollout.weight_dtype
        holdings = engine.weight_holdings()
        element_size = torch.empty((), dtype=self.wire_dtype).element_size()
        specs = param_specs(list(holdings.params), shape, element_size)
        kept = {spec.name for spec in specs}  # a tied lm_head is not sent
        holders = tuple(boxes for (name, _), boxes in zip(holdings.params, holdings.boxes) if name in kept)
        rank, world = dist.get_rank(), dist.get_world_size()
        self.rank = rank
        self.plan: SyncPlan = build_sync_plan(specs, world, rollout.tp_size, shape, bucket_bytes, holders)
        if rollout.tp_rank != rank % rollout.tp_size:
            raise RuntimeError(
                f"rank {rank} is vLLM TP rank {rollout.tp_rank}, but the sync plan assumes TP groups of "
                f"{rollout.tp_size} consecutive trainer ranks (TP rank {rank % rollout.tp_size})"
            )
        self.transfer = SlicedTransfer(self.plan, rank, self.wire_dtype, get_torch_device(), timeout_s, group)
        self.loader = rollout.slice_loader(self.plan.params, shape)
        logger.info(
            "sliced weight sync: %d parameters in %d buckets of <= %d MB; rank %d receives %.1f MB of %.1f MB",
            len(specs), len(self.plan.buckets), bucket_bytes >> 20, rank,
            self.plan.received_bytes(rank) / 2**20, self.plan.model_bytes / 2**20,
        )

    def __call__(self) -> SyncStats:
        """Moves the current weights into vLLM and drops its prefix cache; returns this rank's stats."""
        start = time.perf_counter()
        shards = self.engine.local_weight_shards()
        with self.loader as loader:
            stats = self.transfer.run(shards, loader)
        self.rollout.reset_cache()
        stats.wall_s = time.perf_counter() - start
        return stats


def new_sync_group(timeout_s: float) -> dist.ProcessGroup:
    """A process group over every rank whose operations time out after `timeout_s` (a collective to create)."""
    return dist.new_group(ranks=list(range(dist.get_world_size())), timeout=datetime.timedelta(seconds=timeout_s))


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
