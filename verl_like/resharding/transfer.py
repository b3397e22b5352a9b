"""Runs a SyncPlan: moves each rank's TP slices from the FSDP shards, bucket by bucket, into a sink.

Per bucket, every rank packs the pieces it owes each peer into one flat buffer (cast to the wire dtype), posts
all sends and receives at once (`batch_isend_irecv`, so no ordering can deadlock), copies its local pieces, and
unpacks what arrives into the slices it is assembling. A parameter's slice goes to the sink once complete.
A slice that needs no assembly (this rank's own shard holds all of it, in one piece: every parameter at TP=1 on
one rank, column-parallel ones when the TP and FSDP splits agree) goes to the sink as a view of the shard, in the
shard's dtype: the sink casts while copying it into place (vLLM's loaders do), which saves a copy per parameter.
What each rank does per bucket is worked out once, when the transfer is built; a sync only runs it.
Every wait has a timeout; one that expires raises WeightSyncTimeoutError naming this rank, the peer it waited
for, the bucket and its parameters.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from verl_like.shapes.layout import Box
from verl_like.resharding.plan import Piece, SyncPlan

logger = logging.getLogger(__name__)


class WeightSyncTimeoutError(TimeoutError):
    """A rank did not send or receive its part of a weight sync in time."""


class SliceSink(Protocol):
    """Where completed TP slices go (the rollout engine of this rank)."""

    def load(self, named_slices: list[tuple[str, torch.Tensor]]) -> None:
        """Takes (HF name, this rank's TP slice of it) for the parameters completed in one bucket. A slice is in
        the wire dtype, or a read-only view of the training shard in its own dtype (and device) when it needed no
        assembly; the sink copies it before the next bucket and casts it to its own dtype."""


@dataclass
class SyncStats:
    """What one weight sync did on this rank."""

    wall_s: float
    model_bytes: int
    loaded_bytes: int
    received_bytes: int
    sent_bytes: int
    buckets: int
    mode: str
    adapter_bytes: int = 0  # LoRA adapter-only syncs: the adapter's part of model_bytes (the rest is the base's)

    def metrics(self) -> dict[str, float]:
        """Under `weight_sync/`; gb_per_s is model bytes (wire dtype) per second of wall time. `sync/bytes`: the
        weight bytes this sync moved (an adapter-only sync: the adapter's, plus the base's the first time)."""
        adapter = {"sync/adapter_bytes": float(self.adapter_bytes),
                   "sync/base_bytes": float(self.model_bytes - self.adapter_bytes)} if self.mode == "adapter" else {}
        return {
            "sync/bytes": float(self.model_bytes),
            **adapter,
            "weight_sync/wall_s": self.wall_s,
            "weight_sync/model_bytes": float(self.model_bytes),
            "weight_sync/loaded_bytes": float(self.loaded_bytes),
            "weight_sync/received_bytes": float(self.received_bytes),
            "weight_sync/sent_bytes": float(self.sent_bytes),
            "weight_sync/buckets": float(self.buckets),
            "weight_sync/gb_per_s": self.model_bytes / self.wall_s / 1e9 if self.wall_s > 0 else 0.0,
        }


def _region(tensor: torch.Tensor, box: Box, row_offset: int, col_offset: int) -> torch.Tensor:
    """The part of `tensor` (which starts at full-tensor row `row_offset`, column `col_offset`) under `box`."""
    rows = tensor.narrow(0, box.row_start - row_offset, box.rows)
    if tensor.ndim == 2 and (box.col_start != col_offset or box.col_stop is not None):
        stop = box.col_stop if box.col_stop is not None else col_offset + tensor.shape[1]
        rows = rows.narrow(1, box.col_start - col_offset, stop - box.col_start)
    return rows


@dataclass(frozen=True)
class _RankBucket:
    """What one rank does in one bucket: pieces to send and to receive by peer, pieces to copy from its own
    shards into slices it assembles, and pieces that are whole slices already (handed on as shard views)."""

    sends: tuple[tuple[int, tuple[Piece, ...]], ...]
    receives: tuple[tuple[int, tuple[Piece, ...], int], ...]  # (peer, pieces, elements)
    local: tuple[Piece, ...]
    direct: tuple[Piece, ...]


class SlicedTransfer:
    """Executes `plan` on this rank. `shards[name]` is this rank's rectangle of each parameter it holds
    (`plan.held(rank, i)`); `group` spans the plan's ranks in order (None: the default group)."""

    def __init__(
        self,
        plan: SyncPlan,
        rank: int,
        wire_dtype: torch.dtype,
        device: torch.device,
        timeout_s: float,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        self.plan = plan
        self.rank = rank
        self.wire_dtype = wire_dtype
        self.device = device
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.group = group
        params = plan.params
        self._needed = [plan.needed(rank, i) for i in range(len(params))]
        held = [plan.held(rank, i) for i in range(len(params))]
        self._origin = [(0, 0) if box is None else (box.row_start, box.col_start) for box in held]
        self._shard_shapes = {spec.name: box.shape(spec.shape) for spec, box in zip(params, held) if box is not None}
        self._loaded_bytes = plan.loaded_bytes(rank)
        pieces_to_me: dict[int, list[Piece]] = {}
        for bucket in plan.buckets:
            for piece in bucket.pieces:
                if piece.dst == rank:
                    pieces_to_me.setdefault(piece.param, []).append(piece)
        whole = {param for param, pieces in pieces_to_me.items() if len(pieces) == 1 and pieces[0].src == rank}
        self._schedule = []
        for bucket in plan.buckets:
            own = bucket.local(rank)
            self._schedule.append(_RankBucket(
                sends=tuple((peer, tuple(pieces)) for peer, pieces in bucket.sends(rank).items()),
                receives=tuple(
                    (peer, tuple(pieces), sum(p.box.numel(params[p.param].shape) for p in pieces))
                    for peer, pieces in bucket.receives(rank).items()
                ),
                local=tuple(p for p in own if p.param not in whole),
                direct=tuple(p for p in own if p.param in whole),
            ))

    def _shard_part(self, shards: Mapping[str, torch.Tensor], piece: Piece) -> torch.Tensor:
        return _region(shards[self.plan.params[piece.param].name], piece.box, *self._origin[piece.param])

    def _check_shards(self, shards: Mapping[str, torch.Tensor]) -> None:
        for name, expected in self._shard_shapes.items():
            if name not in shards:
                raise KeyError(f"weight sync: rank {self.rank} has no shard of {name!r}")
            if tuple(shards[name].shape) != expected:
                raise ValueError(
                    f"weight sync: rank {self.rank}'s shard of {name!r} has shape "
                    f"{tuple(shards[name].shape)}, expected {expected} (the box its engine's weight_holdings() "
                    "names)"
                )

    def run(self, shards: Mapping[str, torch.Tensor], sink: SliceSink) -> SyncStats:
        """Moves every bucket; hands completed slices to `sink`; returns this rank's stats."""
        self._check_shards(shards)
        start = time.perf_counter()
        slices: dict[int, torch.Tensor] = {}
        sent = received = 0
        for bucket, mine in zip(self.plan.buckets, self._schedule):
            s, r = self._run_bucket(bucket, mine, shards, slices)
            sent, received = sent + s, received + r
            for piece in mine.direct:
                slices[piece.param] = self._shard_part(shards, piece)
            # A slice with no rows (e.g. vocab padding only) has no pieces; it is still handed on, empty.
            sink.load([(self.plan.params[i].name, self._slice_for(slices, i)) for i in bucket.complete])
            for i in bucket.complete:
                del slices[i]
        return SyncStats(
            wall_s=time.perf_counter() - start,
            model_bytes=self.plan.model_bytes,
            loaded_bytes=self._loaded_bytes,
            received_bytes=received,
            sent_bytes=sent,
            buckets=len(self.plan.buckets),
            mode="sliced",
        )

    def _slice_for(self, slices: dict[int, torch.Tensor], param: int) -> torch.Tensor:
        if param not in slices:
            shape = self._needed[param].shape(self.plan.params[param].shape)
            slices[param] = torch.empty(shape, dtype=self.wire_dtype, device=self.device)
        return slices[param]

    def _place(self, slices: dict[int, torch.Tensor], piece: Piece, data: torch.Tensor) -> None:
        target = self._slice_for(slices, piece.param)
        need = self._needed[piece.param]
        if data.device != target.device:  # CPU-resident shards (offload_policy): copy over, then cast on the device
            data = data.to(target.device)
        _region(target, piece.box, need.row_start, need.col_start).copy_(data)

    def _run_bucket(
        self, bucket, mine: _RankBucket, shards: Mapping[str, torch.Tensor], slices: dict[int, torch.Tensor]
    ) -> tuple[int, int]:
        params = self.plan.params
        ops, outgoing, incoming = [], {}, {}
        for peer, pieces in mine.sends:
            parts = [self._shard_part(shards, p).to(self.device, self.wire_dtype).reshape(-1) for p in pieces]
            outgoing[peer] = torch.cat(parts)
            ops.append(dist.P2POp(dist.isend, outgoing[peer], peer, group=self.group))
        for peer, _, numel in mine.receives:
            incoming[peer] = torch.empty(numel, dtype=self.wire_dtype, device=self.device)
            ops.append(dist.P2POp(dist.irecv, incoming[peer], peer, group=self.group))
        works = dist.batch_isend_irecv(ops) if ops else []
        for piece in mine.local:
            self._place(slices, piece, self._shard_part(shards, piece))
        for op, work in zip(ops, works):
            self._wait(work, op.peer, "send to" if op.op is dist.isend else "receive from", bucket)
        for peer, pieces, _ in mine.receives:
            offset = 0
            for piece in pieces:
                shape = piece.box.shape(params[piece.param].shape)
                numel = piece.box.numel(params[piece.param].shape)
                self._place(slices, piece, incoming[peer][offset : offset + numel].view(shape))
                offset += numel
        element = torch.empty((), dtype=self.wire_dtype).element_size()
        return (sum(t.numel() for t in outgoing.values()) * element,
                sum(t.numel() for t in incoming.values()) * element)

    def _wait(self, work: dist.Work, peer: int, what: str, bucket) -> None:
        try:
            work.wait(timeout=self.timeout)
        except RuntimeError as err:
            names = sorted({self.plan.params[p.param].name for p in bucket.pieces})
            shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
            raise WeightSyncTimeoutError(
                f"weight sync: rank {self.rank} timed out after {self.timeout.total_seconds():g} s waiting to "
                f"{what} rank {peer} (bucket {bucket.index + 1}/{len(self.plan.buckets)}: {shown}); rank {peer} "
                f"probably failed or never started this sync ({err})"
            ) from err
