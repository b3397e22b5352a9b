"""The sync plan: which rectangle of which parameter travels from which training rank to which rollout rank, in buckets.

Training side: `holders[i][rank]` is the rectangle (`Box`, full-tensor coordinates, HF layout) of parameter i that
training rank `rank` holds, or None; the engine describes it (`TrainEngine.weight_holdings`). FSDP2 shards every
parameter on dim 0 over all W ranks (`fsdp_holders`, torch.chunk rows); Megatron holds TP slices per pipeline stage,
replicated over its data-parallel ranks. Rollout side: TP groups of T consecutive ranks; rank r is TP rank r % T and
needs `tp_slice(...)` of each parameter (layout.py). For every (parameter, receiving rank) the plan intersects the
needed rectangle with the distinct held rectangles (which must not overlap) and takes each part from one holder: the
receiving rank itself when it holds it, else the holder that has sent least so far (spreading replicas' load). Each
rank receives exactly its TP slice, nothing more. When the training shards of a parameter are split the way TP
splits it (FSDP with T == W column-parallel, or Megatron TP == vLLM TP), the needed parts are the rank's own and
nothing moves.

Buckets bound memory: a parameter is cut into bands of whole rows of at most `bucket_bytes` (full-tensor
bytes), and bands are packed greedily into buckets so that no rank assembles more than `bucket_bytes` of slices
per bucket. A rank's slice of a parameter is handed on once its last band has arrived (vLLM's loaders take a
parameter's slice in one piece), so a parameter larger than a bucket still works, at the cost of holding its
slice while its bands arrive. Every rank computes the same plan from the same inputs; nothing is negotiated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from verl_like.shapes.decoder import DecoderShape
from verl_like.shapes.layout import Box, ParamSpec, Placement, check_full_shape, param_layout, tp_slice


@dataclass(frozen=True)
class Piece:
    """Rows/columns `box` (full-tensor coordinates) of parameter `param` sent from rank `src` to rank `dst`."""

    param: int
    src: int
    dst: int
    box: Box


@dataclass(frozen=True)
class Bucket:
    """One round of transfers. `complete` lists the parameters whose last band is in this bucket (in order)."""

    index: int
    pieces: tuple[Piece, ...]
    complete: tuple[int, ...]

    def sends(self, rank: int) -> dict[int, list[Piece]]:
        """Pieces `rank` sends, by receiving peer (pieces to itself excluded), in plan order."""
        out: dict[int, list[Piece]] = {}
        for piece in self.pieces:
            if piece.src == rank and piece.dst != rank:
                out.setdefault(piece.dst, []).append(piece)
        return out

    def receives(self, rank: int) -> dict[int, list[Piece]]:
        """Pieces `rank` receives, by sending peer (pieces from itself excluded), in plan order."""
        out: dict[int, list[Piece]] = {}
        for piece in self.pieces:
            if piece.dst == rank and piece.src != rank:
                out.setdefault(piece.src, []).append(piece)
        return out

    def local(self, rank: int) -> list[Piece]:
        """Pieces `rank` already holds (copied locally)."""
        return [p for p in self.pieces if p.src == rank and p.dst == rank]


@dataclass(frozen=True)
class SyncPlan:
    """Every bucket of one weight sync, for `world_size` training ranks and rollout TP groups of `tp_size`."""

    params: tuple[ParamSpec, ...]
    world_size: int
    tp_size: int
    shape: DecoderShape
    bucket_bytes: int
    buckets: tuple[Bucket, ...] = field(default=())
    holders: tuple[tuple[Box | None, ...], ...] = field(default=())

    def held(self, rank: int, param: int) -> Box | None:
        """The rectangle of parameter `param` that training rank `rank` holds, or None."""
        return self.holders[param][rank]

    def needed(self, rank: int, param: int) -> Box:
        """The rectangle of parameter `param` that rollout rank `rank` loads into vLLM."""
        spec = self.params[param]
        return tp_slice(spec.layout, spec.shape, self.shape, rank % self.tp_size, self.tp_size)

    def received_bytes(self, rank: int) -> int:
        """Bytes `rank` receives from other ranks over the whole sync."""
        return sum(
            piece.box.numel(self.params[piece.param].shape) * self.params[piece.param].element_size
            for bucket in self.buckets
            for piece in bucket.pieces
            if piece.dst == rank and piece.src != rank
        )

    def loaded_bytes(self, rank: int) -> int:
        """Bytes of TP slices `rank` hands to its rollout engine over the whole sync."""
        return sum(
            self.needed(rank, i).numel(spec.shape) * spec.element_size for i, spec in enumerate(self.params)
        )

    @property
    def model_bytes(self) -> int:
        """Bytes of the full model on the wire dtype (each tied parameter once)."""
        return sum(spec.nbytes for spec in self.params)


def fsdp_holders(params: tuple[ParamSpec, ...], world_size: int) -> tuple[tuple[Box | None, ...], ...]:
    """Holder boxes of dim-0 FSDP2 shards over `world_size` ranks (every column of a rank's rows)."""
    return tuple(
        tuple(Box(*fsdp_rows(spec.shape[0], world_size, rank)) for rank in range(world_size)) for spec in params
    )


def fsdp_rows(rows: int, world_size: int, rank: int) -> tuple[int, int]:
    """Rows [start, stop) of a dim-0 FSDP2 shard (torch.chunk layout; trailing ranks may hold none)."""
    chunk = -(-rows // world_size)
    start = min(rank * chunk, rows)
    return start, min(start + chunk, rows)


def param_specs(
    named_shapes: list[tuple[str, tuple[int, ...]]], shape: DecoderShape, element_size: int
) -> tuple[ParamSpec, ...]:
    """ParamSpecs for the HF parameters in training order; tied lm_head dropped. Raises UnknownLayoutError."""
    specs = []
    for name, full_shape in named_shapes:
        layout = param_layout(name, shape)
        if layout.placement is Placement.TIED:
            continue
        check_full_shape(layout, tuple(full_shape), shape)
        specs.append(ParamSpec(name, tuple(full_shape), layout, element_size))
    return tuple(specs)


def _band_rows(spec: ParamSpec, bucket_bytes: int) -> int:
    return max(1, bucket_bytes // spec.row_bytes)


def _distinct_holdings(spec: ParamSpec, per_rank: tuple[Box | None, ...]) -> list[tuple[Box, list[int]]]:
    """The distinct non-empty boxes of one parameter with the ranks holding each; raises when two overlap."""
    cols = spec.shape[1] if len(spec.shape) == 2 else 1
    distinct: dict[Box, list[int]] = {}
    for rank, box in enumerate(per_rank):
        if box is None or box.numel(spec.shape) == 0:
            continue
        key = Box(box.row_start, box.row_stop, box.col_start, None if box.col_stop == cols else box.col_stop)
        distinct.setdefault(key, []).append(rank)
    boxes = list(distinct)
    for i, first in enumerate(boxes):
        for second in boxes[i + 1:]:
            if first.intersect(second, cols) is not None:
                raise ValueError(f"weight sync: the training ranks' shards of {spec.name} overlap without being "
                                 f"equal ({first} and {second}); the engine's weight_holdings() is inconsistent")
    return [(box, distinct[box]) for box in boxes]


def build_sync_plan(
    params: tuple[ParamSpec, ...],
    world_size: int,
    tp_size: int,
    shape: DecoderShape,
    bucket_bytes: int,
    holders: tuple[tuple[Box | None, ...], ...] | None = None,
) -> SyncPlan:
    """The plan for syncing `params` (training order) from the training ranks' `holders` (default: FSDP2 dim-0
    shards over `world_size` ranks) into rollout TP groups of `tp_size` over the same ranks."""
    if world_size % tp_size:
        raise ValueError(f"tensor_model_parallel_size={tp_size} does not divide the world size {world_size}")
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes={bucket_bytes} must be >= 1")
    shape.check_tp(tp_size)
    holders = fsdp_holders(params, world_size) if holders is None else tuple(tuple(h) for h in holders)
    if len(holders) != len(params) or any(len(h) != world_size for h in holders):
        raise ValueError(f"weight sync: holders must give one box (or None) per rank of {world_size} for each of "
                         f"the {len(params)} parameters")
    plan = SyncPlan(params, world_size, tp_size, shape, bucket_bytes, holders=holders)
    sent = [0] * world_size  # bytes assigned to each sender so far (spreads the load over replicas)

    buckets: list[Bucket] = []
    pieces: list[Piece] = []
    complete: list[int] = []
    assembled = [0] * world_size  # bytes each rank assembles in the open bucket

    def close() -> None:
        nonlocal pieces, complete, assembled
        if pieces or complete:
            buckets.append(Bucket(len(buckets), tuple(pieces), tuple(complete)))
        pieces, complete, assembled = [], [], [0] * world_size

    for index, spec in enumerate(params):
        cols = spec.shape[1] if len(spec.shape) == 2 else 1
        holdings = _distinct_holdings(spec, holders[index])
        band = _band_rows(spec, bucket_bytes)
        needs = [plan.needed(rank, index) for rank in range(world_size)]
        for rank, need in enumerate(needs):
            covered = sum(0 if (part := need.intersect(box, cols)) is None else part.numel(spec.shape)
                          for box, _ in holdings)
            if covered != need.numel(spec.shape):
                raise ValueError(f"weight sync: no training rank holds part of {spec.name} that rollout rank {rank} "
                                 "needs; the engine's weight_holdings() misses it")
        for band_start in range(0, spec.shape[0], band):
            band_stop = min(band_start + band, spec.shape[0])
            band_needs = [need.intersect_rows(band_start, band_stop) for need in needs]
            sizes = [0 if b is None else b.numel(spec.shape) * spec.element_size for b in band_needs]
            if any(a + s > bucket_bytes for a, s in zip(assembled, sizes)) and any(assembled):
                close()
            for dst, need in enumerate(band_needs):
                if need is None:
                    continue
                for box, ranks in holdings:
                    part = need.intersect(box, cols)
                    if part is None:
                        continue
                    src = dst if dst in ranks else min(ranks, key=lambda r: (sent[r], r))
                    if src != dst:
                        sent[src] += part.numel(spec.shape) * spec.element_size
                    pieces.append(Piece(index, src, dst, part))
            assembled = [a + s for a, s in zip(assembled, sizes)]
        complete.append(index)
    close()
    return SyncPlan(params, world_size, tp_size, shape, bucket_bytes, tuple(buckets), holders)
