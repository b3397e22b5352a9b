"""How a group call fans its arguments out to workers and collects their results.

A worker method opts into group calls with `@register(...)`. The decorator only records a `MethodSpec` on the
function; `WorkerGroup` reads it when the method is called through the group. Nothing is attached at run time.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypeVar

from verl_like.protocol import DataProto, pad_to_divisor, unpad

F = TypeVar("F", bound=Callable[..., Any])

_SPEC_ATTR = "__verl_like_method_spec__"


class Dispatch(enum.Enum):
    """How arguments are split over the workers of a group and how results come back."""

    ONE_TO_ALL = "one_to_all"
    """Every worker gets the same arguments; the result is a list with one entry per worker."""
    ALL_TO_ALL = "all_to_all"
    """Each argument is a list with one entry per worker; worker r gets entry r; results are a list."""
    DP_COMPUTE_PROTO = "dp_compute_proto"
    """DataProto arguments are chunked over all workers (padded to a divisor); results are concatenated."""
    DP_MESH = "dp_mesh"
    """Like DP_COMPUTE_PROTO over a named mesh: workers with the same DP rank share a chunk, one returns it."""


class Execute(enum.Enum):
    """Which workers run the method."""

    ALL = "all"
    RANK_ZERO = "rank_zero"


@dataclass(frozen=True)
class MethodSpec:
    """What `@register` records on a worker method."""

    dispatch: Dispatch
    execute: Execute
    blocking: bool
    mesh: str | None
    timeout_s: float | None


def register(
    dispatch: Dispatch = Dispatch.ALL_TO_ALL,
    execute: Execute = Execute.ALL,
    blocking: bool = True,
    mesh: str | None = None,
    timeout_s: float | None = None,
) -> Callable[[F], F]:
    """Marks a worker method as callable through a `WorkerGroup` with the given dispatch and execution.

    `mesh` names the mesh for `Dispatch.DP_MESH` (e.g. "actor", "rollout"); the worker declares its place in
    that mesh with `Worker.register_mesh`. `timeout_s` overrides the group's default timeout for this method.
    """
    if dispatch is Dispatch.DP_MESH and not mesh:
        raise ValueError("register(dispatch=Dispatch.DP_MESH) needs mesh='<name>' (e.g. mesh='actor')")
    if dispatch is not Dispatch.DP_MESH and mesh is not None:
        raise ValueError(f"register(mesh={mesh!r}) is only meaningful with dispatch=Dispatch.DP_MESH")
    spec = MethodSpec(dispatch=dispatch, execute=execute, blocking=blocking, mesh=mesh, timeout_s=timeout_s)

    def decorate(fn: F) -> F:
        setattr(fn, _SPEC_ATTR, spec)
        return fn

    return decorate


def method_spec(fn: Callable[..., Any]) -> MethodSpec | None:
    """The `MethodSpec` recorded by `@register`, or None for a plain method."""
    return getattr(fn, _SPEC_ATTR, None)


@dataclass(frozen=True)
class MeshInfo:
    """Where each worker (by group rank) sits in a named mesh."""

    name: str
    dp_size: int
    dp_rank_of: tuple[int, ...]
    """dp_rank_of[r]: the data-parallel rank of group rank r."""
    collect_ranks: tuple[int, ...]
    """Group ranks whose results are collected, ordered by their DP rank (one per DP rank)."""


def build_mesh_info(name: str, declared: Sequence[tuple[int, int, bool]]) -> MeshInfo:
    """Checks the per-rank declarations (dp_rank, dp_size, is_collect) of one mesh and returns its MeshInfo."""
    sizes = {dp_size for _, dp_size, _ in declared}
    if len(sizes) != 1:
        raise ValueError(f"mesh {name!r}: workers declared different dp sizes {sorted(sizes)}")
    dp_size = sizes.pop()
    collect: dict[int, int] = {}
    for rank, (dp_rank, _, is_collect) in enumerate(declared):
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"mesh {name!r}: rank {rank} declared dp_rank={dp_rank} outside [0, {dp_size})")
        if is_collect:
            if dp_rank in collect:
                raise ValueError(
                    f"mesh {name!r}: ranks {collect[dp_rank]} and {rank} both collect dp_rank {dp_rank}; "
                    "exactly one rank per DP group may return results"
                )
            collect[dp_rank] = rank
    missing = [d for d in range(dp_size) if d not in collect]
    if missing:
        raise ValueError(f"mesh {name!r}: no rank returns results for dp ranks {missing}")
    return MeshInfo(
        name=name,
        dp_size=dp_size,
        dp_rank_of=tuple(d for d, _, _ in declared),
        collect_ranks=tuple(collect[d] for d in range(dp_size)),
    )


@dataclass(frozen=True)
class Plan:
    """Per-rank arguments of one call and how to turn the per-rank results into the caller's result."""

    ranks: tuple[int, ...]
    args: tuple[tuple[Any, ...], ...]
    kwargs: tuple[dict[str, Any], ...]
    collect_ranks: tuple[int, ...]
    concat: bool
    pad_size: int
    single: bool = False
    """True when the caller gets the one result itself rather than a list (RANK_ZERO execution)."""


def _split_proto_args(args: tuple, kwargs: dict, chunks: int) -> tuple[list[tuple], list[dict], int]:
    """Chunks every DataProto (or DataProto future) argument into `chunks` parts; other values are shared."""
    pad_sizes: set[int] = set()

    def chunk(value: Any) -> list[Any]:
        if isinstance(value, DataProto):
            padded, pad = pad_to_divisor(value, chunks)
            pad_sizes.add(pad)
            return padded.chunk(chunks)
        if hasattr(value, "for_chunks"):
            return value.for_chunks(chunks)
        return [value] * chunks

    arg_parts = [chunk(a) for a in args]
    kwarg_parts = {k: chunk(v) for k, v in kwargs.items()}
    if len(pad_sizes) > 1:
        raise ValueError(f"DataProto arguments of one call have different lengths (padding {sorted(pad_sizes)})")
    per_chunk_args = [tuple(parts[i] for parts in arg_parts) for i in range(chunks)]
    per_chunk_kwargs = [{k: parts[i] for k, parts in kwarg_parts.items()} for i in range(chunks)]
    return per_chunk_args, per_chunk_kwargs, pad_sizes.pop() if pad_sizes else 0


def plan_call(
    spec: MethodSpec, world_size: int, args: tuple, kwargs: dict, mesh: MeshInfo | None = None
) -> Plan:
    """Decides which rank gets which arguments for one group call."""
    if spec.execute is Execute.RANK_ZERO:
        return Plan((0,), (args,), (kwargs,), (0,), concat=False, pad_size=0, single=True)
    ranks = tuple(range(world_size))
    if spec.dispatch is Dispatch.ONE_TO_ALL:
        return Plan(ranks, (args,) * world_size, (kwargs,) * world_size, ranks, concat=False, pad_size=0)
    if spec.dispatch is Dispatch.ALL_TO_ALL:
        for i, value in enumerate(list(args) + list(kwargs.values())):
            if not isinstance(value, (list, tuple)) or len(value) != world_size:
                raise ValueError(
                    f"ALL_TO_ALL argument {i} must be a list with one entry per worker ({world_size}), "
                    f"got {type(value).__name__}"
                    + (f" of length {len(value)}" if isinstance(value, (list, tuple)) else "")
                )
        per_args = tuple(tuple(a[r] for a in args) for r in ranks)
        per_kwargs = tuple({k: v[r] for k, v in kwargs.items()} for r in ranks)
        return Plan(ranks, per_args, per_kwargs, ranks, concat=False, pad_size=0)
    if spec.dispatch is Dispatch.DP_COMPUTE_PROTO:
        chunk_args, chunk_kwargs, pad = _split_proto_args(args, kwargs, world_size)
        return Plan(ranks, tuple(chunk_args), tuple(chunk_kwargs), ranks, concat=True, pad_size=pad)
    if spec.dispatch is Dispatch.DP_MESH:
        assert mesh is not None, "DP_MESH dispatch needs the group's mesh info"
        chunk_args, chunk_kwargs, pad = _split_proto_args(args, kwargs, mesh.dp_size)
        per_args = tuple(chunk_args[mesh.dp_rank_of[r]] for r in ranks)
        per_kwargs = tuple(chunk_kwargs[mesh.dp_rank_of[r]] for r in ranks)
        return Plan(ranks, per_args, per_kwargs, mesh.collect_ranks, concat=True, pad_size=pad)
    raise ValueError(f"unknown dispatch mode {spec.dispatch}")


def collect_results(plan: Plan, results: Sequence[Any]) -> Any:
    """Turns the results of `plan.collect_ranks` (in that order) into the caller's value."""
    if plan.single:
        return results[0]
    if not plan.concat:
        return list(results)
    if not all(isinstance(r, DataProto) for r in results):
        kinds = sorted({type(r).__name__ for r in results})
        raise TypeError(f"a DP-dispatched method must return DataProto from every collecting rank, got {kinds}")
    return unpad(DataProto.concat(list(results)), plan.pad_size)
