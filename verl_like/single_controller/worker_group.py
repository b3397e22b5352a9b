"""`WorkerGroup`: one Ray actor per bundle of a pool; calls on the group fan out to the workers and collect.

    group = WorkerGroup(pool, {"actor": RoleSpec(ActorWorker), "ref": RoleSpec(RefWorker)}, name="actor_ref")
    log_probs = group.role("actor").compute_log_prob(batch)      # DataProto in, DataProto out
    future = group.role("actor").generate(batch, blocking=False) # GroupFuture
    group.role("ref").compute_ref_log_prob(future)               # chunks flow worker to worker, not via driver

`group.role(name).method` resolves only methods that the role's class decorated with `@register`; their
dispatch mode says how arguments are split and results collected (see dispatch.py). With a single role,
`group.method(...)` works directly.
"""

from __future__ import annotations

import atexit
import logging
import time
import uuid
import weakref
from typing import Any, Callable

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from verl_like.single_controller.dispatch import (
    Dispatch,
    MeshInfo,
    MethodSpec,
    Plan,
    build_mesh_info,
    collect_results,
    method_spec,
    plan_call,
)
from verl_like.single_controller.errors import WorkerDiedError, WorkerError, WorkerTimeoutError
from verl_like.single_controller.host import ProtoChunkRef, RoleSpec, WorkerHost
from verl_like.single_controller.resource_pool import ResourcePool
from verl_like.single_controller.timeouts import CallTimeouts

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 3600.0
_LIVE_GROUPS: "weakref.WeakSet[WorkerGroup]" = weakref.WeakSet()


class GroupFuture:
    """The pending result of a non-blocking group call.

    `result()` waits (with the call's timeout) and collects as a blocking call would. Passed as an argument to
    another group's DP-dispatched call, its DataProto chunks go from worker to worker through the object store.
    """

    def __init__(
        self,
        where: str,
        plan: Plan,
        refs: dict[int, ray.ObjectRef],
        timeout_s: float,
        timeouts: CallTimeouts | None = None,
    ) -> None:
        self._where = where
        self._plan = plan
        self._refs = refs
        self._timeout_s = timeout_s
        self._timeouts = timeouts  # set when timeout_s is the group's default: learns the call's duration
        self._started = time.monotonic()

    def result(self, timeout_s: float | None = None) -> Any:
        how = self._timeouts.describe(self._where) if self._timeouts is not None and not timeout_s else None
        values = _wait_all(self._where, self._refs, timeout_s or self._timeout_s, how)
        if self._timeouts is not None:
            self._timeouts.record(self._where, time.monotonic() - self._started)
        return collect_results(self._plan, [values[r] for r in self._plan.collect_ranks])

    def for_chunks(self, num_chunks: int) -> list[ProtoChunkRef]:
        """Chunk references for a consumer group with `num_chunks` DP ranks (used by dispatch)."""
        if not self._plan.concat:
            raise TypeError(f"{self._where} does not return a DataProto; only DP results can be chained")
        refs = tuple(self._refs[r] for r in self._plan.collect_ranks)
        return [ProtoChunkRef(refs, self._plan.pad_size, i, num_chunks) for i in range(num_chunks)]


class GroupMethod:
    """A registered worker method bound to a group role; calling it runs it on the group's workers."""

    def __init__(self, group: "WorkerGroup", role: str, name: str, spec: MethodSpec) -> None:
        self._group = group
        self._role = role
        self._name = name
        self.spec = spec

    def __call__(self, *args: Any, blocking: bool | None = None, timeout_s: float | None = None, **kwargs: Any) -> Any:
        return self._group._call(self._role, self._name, self.spec, args, kwargs, blocking, timeout_s)

    def __repr__(self) -> str:
        return f"<group method {self._group.name}.{self._role}.{self._name} {self.spec.dispatch.value}>"


class RoleHandle:
    """The methods of one role of a group, as `handle.method(...)` or `handle.call(Cls.method, ...)`."""

    def __init__(self, group: "WorkerGroup", role: str, cls: type) -> None:
        self._group = group
        self._role = role
        self._cls = cls

    def method(self, name: str) -> GroupMethod:
        fn = getattr(self._cls, name, None)
        spec = method_spec(fn) if fn is not None else None
        if spec is None:
            registered = sorted(n for n in dir(self._cls) if method_spec(getattr(self._cls, n, None)) is not None)
            raise AttributeError(
                f"{self._cls.__name__}.{name} is not a @register-ed method of role {self._role!r} in group "
                f"{self._group.name!r}; registered: {registered}"
            )
        return GroupMethod(self._group, self._role, name, spec)

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Calls `fn` (an unbound method of the role's class, e.g. `ActorWorker.update_actor`) on the group."""
        return self.method(fn.__name__)(*args, **kwargs)

    def __getattr__(self, name: str) -> GroupMethod:
        if name.startswith("_"):
            raise AttributeError(name)
        return self.method(name)


class WorkerGroup:
    """`pool.world_size` Ray actors, rank r in slot r, each constructing the given roles in one process."""

    def __init__(
        self,
        pool: ResourcePool,
        roles: dict[str, RoleSpec] | RoleSpec,
        name: str,
        resource_fraction: float = 1.0,
        default_timeout_s: float | CallTimeouts = DEFAULT_TIMEOUT_S,
        init_timeout_s: float = 600.0,
        env_vars: dict[str, str] | None = None,
    ) -> None:
        if isinstance(roles, RoleSpec):
            roles = {name: roles}
        if not roles:
            raise ValueError(f"worker group {name!r} needs at least one role")
        if not 0 < resource_fraction <= 1:
            raise ValueError(f"resource_fraction={resource_fraction} must be in (0, 1]")
        self.name = name
        self.pool = pool
        self.roles = dict(roles)
        # A number is every call's default; CallTimeouts adapts each method's default to its earlier calls.
        if not isinstance(default_timeout_s, CallTimeouts):
            default_timeout_s = CallTimeouts(fixed_s=default_timeout_s)
        self.call_timeouts = default_timeout_s
        self.default_timeout_s = self.call_timeouts.fixed_s or self.call_timeouts.first_call_s
        self._meshes: dict[tuple[str, str], MeshInfo] = {}
        self._actors: list[Any] = []
        # Seconds of the start: until rank 0's process answered (Ray's worker start, the host's imports), then
        # until every rank had constructed its roles (their modules' imports, process groups, __init__).
        self.startup_times: dict[str, float] = {}
        _LIVE_GROUPS.add(self)
        try:
            self._spawn(resource_fraction, init_timeout_s, env_vars or {})
        except BaseException:
            self.shutdown()
            raise

    @property
    def world_size(self) -> int:
        return len(self._actors)

    @property
    def actors(self) -> list[Any]:
        """The Ray actor handles, by rank (for tests and advanced use)."""
        return list(self._actors)

    def _spawn(self, fraction: float, init_timeout_s: float, env_vars: dict[str, str]) -> None:
        host_cls = ray.remote(WorkerHost)
        tag = uuid.uuid4().hex[:6]
        for rank, slot in enumerate(self.pool.slots):
            options: dict[str, Any] = {
                "num_cpus": self.pool.cpus_per_process * fraction,
                "num_gpus": fraction if self.pool.device == "cuda" else 0,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    placement_group=slot.placement_group, placement_group_bundle_index=slot.bundle_index
                ),
                "name": f"{self.name}_{tag}_rank{rank}",
                "max_concurrency": 1,
            }
            if env_vars:
                options["runtime_env"] = {"env_vars": dict(env_vars)}
            self._actors.append(
                host_cls.options(**options).remote(
                    rank, self.pool.world_size, slot.local_rank, self.pool.local_world_size(slot), self.pool.device
                )
            )
        # Actors wait for free bundle resources: a group that never starts usually means the groups sharing this
        # pool ask for resource_fractions adding up to more than 1.
        where = f"group {self.name!r} start (actors waiting for resources in pool {self.pool.name!r}?)"
        started = time.perf_counter()
        master_addr, master_port = _wait_all(where, {0: self._actors[0].rendezvous_address.remote()}, init_timeout_s)[0]
        answered = time.perf_counter()
        inits = {r: a.init_roles.remote(self.roles, master_addr, master_port) for r, a in enumerate(self._actors)}
        _wait_all(f"group {self.name!r} role construction", inits, init_timeout_s)
        self.startup_times = {
            "process_start_s": answered - started, "role_construction_s": time.perf_counter() - answered,
        }
        logger.info("worker group %r: %d workers, roles %s", self.name, self.world_size, list(self.roles))

    def role(self, name: str) -> RoleHandle:
        if name not in self.roles:
            raise KeyError(f"worker group {self.name!r} has no role {name!r}; roles: {list(self.roles)}")
        return RoleHandle(self, name, self.roles[name].cls)

    def __getattr__(self, name: str) -> GroupMethod:
        # Only reached for names that are not attributes of the group: registered methods of its only role.
        if name.startswith("_") or "roles" not in self.__dict__:
            raise AttributeError(name)
        if len(self.roles) != 1:
            raise AttributeError(
                f"worker group {self.name!r} colocates roles {list(self.roles)}; call group.role('<name>').{name}"
            )
        return self.role(next(iter(self.roles))).method(name)

    def _mesh(self, role: str, mesh: str) -> MeshInfo:
        key = (role, mesh)
        if key not in self._meshes:
            refs = {r: a.mesh_declaration.remote(role, mesh) for r, a in enumerate(self._actors)}
            declared = _wait_all(f"{self.name}.{role} mesh {mesh!r}", refs, self.default_timeout_s)
            missing = [r for r in range(self.world_size) if declared[r] is None]
            if missing:
                raise ValueError(
                    f"role {role!r} of group {self.name!r}: ranks {missing} never called "
                    f"register_mesh({mesh!r}, ...), which Dispatch.DP_MESH(mesh={mesh!r}) needs"
                )
            self._meshes[key] = build_mesh_info(mesh, [declared[r] for r in range(self.world_size)])
        return self._meshes[key]

    def _call(
        self,
        role: str,
        method: str,
        spec: MethodSpec,
        args: tuple,
        kwargs: dict,
        blocking: bool | None,
        timeout_s: float | None,
    ) -> Any:
        mesh = self._mesh(role, spec.mesh) if spec.dispatch is Dispatch.DP_MESH else None
        plan = plan_call(spec, self.world_size, args, kwargs, mesh)
        collect = set(plan.collect_ranks)
        refs = {
            rank: self._actors[rank].execute.remote(role, method, rank in collect, plan.args[i], plan.kwargs[i])
            for i, rank in enumerate(plan.ranks)
        }
        where = f"{self.name}.{role}.{method}"
        if timeout_s or spec.timeout_s:
            future = GroupFuture(where, plan, refs, timeout_s or spec.timeout_s)
        else:
            future = GroupFuture(where, plan, refs, self.call_timeouts.timeout_for(where), self.call_timeouts)
        if blocking is False or (blocking is None and not spec.blocking):
            return future
        return future.result()

    def shutdown(self) -> None:
        """Kills the group's actors (idempotent). The pool's placement groups stay for other groups."""
        for actor in self._actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception as exc:  # an actor already gone is fine; anything else is logged
                logger.debug("killing an actor of group %r: %s", self.name, exc)
        self._actors = []
        _LIVE_GROUPS.discard(self)


def shutdown_all_groups() -> None:
    """Kills the actors of every live group (registered with atexit, so none outlives the driver)."""
    for group in list(_LIVE_GROUPS):
        group.shutdown()


atexit.register(shutdown_all_groups)


def _wait_all(where: str, refs: dict[int, ray.ObjectRef], timeout_s: float, how: str | None = None) -> dict[int, Any]:
    """Results by rank; raises as soon as any rank fails, or names the ranks still running at the timeout
    (`how` says how that timeout was chosen)."""
    pending = {ref: rank for rank, ref in refs.items()}
    values: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    while pending:
        remaining = deadline - time.monotonic()
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(remaining, 0))
        if not ready:
            raise WorkerTimeoutError(where, sorted(pending.values()), timeout_s, how)
        for ref in ready:
            rank = pending.pop(ref)
            try:
                values[rank] = ray.get(ref)
            except ray.exceptions.RayTaskError as exc:
                raise WorkerError(where, rank, _remote_traceback(exc)) from None
            except ray.exceptions.RayActorError as exc:
                raise WorkerDiedError(where, rank, _first_line(exc)) from None
    return values


def _remote_traceback(exc: ray.exceptions.RayTaskError) -> str:
    return getattr(exc, "traceback_str", None) or str(exc)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
