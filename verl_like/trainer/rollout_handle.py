"""What the trainer loop generates with and syncs into, whatever the placement.

`ColocatedRollout`: the engines live in the actor-rollout workers (verl's hybrid engine); both calls go to them.
`ServerRolloutHandle`: vLLM servers on their own pool (or the user's); the driver sends the requests
(`ServerGenerator`) and the actor group's rank 0 sends the weights (`ServerTransport`).
Both return the same DataProto: the rollout layout of `RolloutEngine`, its `TrainRequest`'s temperature and rollout/*
metrics. Weights move only in `sync_weights` and `load_checkpoint` (and, colocated, when an engine's sleep discarded
them); both keep `weight_version`, the policy version the rollout holds (workers/weight_version.py).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from verl_like.config.placement import PlacementKind
from verl_like.protocol import DataProto
from verl_like.rollout.request import GenerationRequest
from verl_like.single_controller import ResourcePool
from verl_like.single_controller.worker_group import RoleHandle
from verl_like.workers.train_request import TrainRequest

if TYPE_CHECKING:  # server mode's HTTP client (httpx) is imported only when a run uses servers
    from verl_like.rollout.server_backend import ServerBackend
    from verl_like.rollout.server_client import ServerClient
    from verl_like.rollout.servers import ServerGenerator
    from verl_like.trainer.server_supervision import ServerSupervision

logger = logging.getLogger(__name__)


def synced_version(metrics: list[dict[str, float]], current: int) -> int:
    """The policy version a sync's per-rank metrics report (weight_sync/version), else `current` (a worker whose
    text hook keeps its own weights syncs nothing)."""
    versions = [m["weight_sync/version"] for m in metrics if m and "weight_sync/version" in m]
    return int(max(versions)) if versions else current


class RolloutHandle(Protocol):
    """What the loop generates with and syncs into, whatever the placement (module doc): `ColocatedRollout` or
    `ServerRolloutHandle`. weight_version: the policy version the rollout holds. restarts: server restarts so far."""

    weight_version: int

    @property
    def restarts(self) -> int: ...

    def generate(self, prompts: DataProto) -> DataProto: ...

    def sync_weights(self) -> list[dict[str, float]]: ...

    def load_checkpoint(self, directory: str, weight_version: int) -> None: ...

    def recover(self, error: BaseException, restarts_at_launch: int) -> int | None: ...

    def close(self) -> None: ...


class ColocatedRollout:
    """The rollout engines inside the actor-rollout workers."""

    def __init__(self, actor_rollout: RoleHandle) -> None:
        self.actor_rollout = actor_rollout
        self.weight_version = 0  # the policy version the engines hold: actor updates synced into them

    def generate(self, prompts: DataProto) -> DataProto:
        return self.actor_rollout.generate_sequences(prompts)

    restarts = 0  # in-process engines die with their workers (trainer.max_restarts restarts those)

    def recover(self, error: BaseException, restarts_at_launch: int) -> int | None:
        """Nothing to restart here (trainer/async_rollout.py:BackgroundRecovery): the error is raised."""
        return None

    def sync_weights(self) -> list[dict[str, float]]:
        metrics = self.actor_rollout.sync_weights()
        self.weight_version = synced_version(metrics, self.weight_version)
        return metrics

    def load_checkpoint(self, directory: str, weight_version: int) -> None:
        """Restores the actor from `directory` and syncs it into the rollout as policy version `weight_version`."""
        self.actor_rollout.load_checkpoint(directory, weight_version)
        self.weight_version = weight_version

    def close(self) -> None:
        try:
            # Release the engines first (on CPU, TP engines hold shared-memory segments).
            self.actor_rollout.close(timeout_s=120)
        except Exception as err:  # a failed run may have lost workers; shutting down must still proceed
            logger.warning("closing the rollout engines failed: %s", err)


class ServerRolloutHandle:
    """vLLM servers: generation from the driver, weights from the actor group's rank 0 (module doc)."""

    def __init__(self, rollout_config: Any, actor_rollout: RoleHandle, servers: ServerGenerator,
                 supervisors: list[Any] | None = None, pool: ResourcePool | None = None,
                 supervision: ServerSupervision | None = None, serves_adapters: bool = False) -> None:
        """serves_adapters: LoRA adapter-only sync; every request names the servers' active adapter."""
        self.config = rollout_config
        self.actor_rollout = actor_rollout
        self.servers = servers
        self.supervisors = supervisors or []
        self.pool = pool
        self.supervision = supervision  # restarts dead servers we started (trainer/server_supervision.py)
        self._driver_thread = threading.current_thread()  # the one that may restart servers (worker-group calls)
        self.agents: Any = None  # an AgentLoopRunner once start_agent_loops ran
        self._token_generator: Any = None
        self.weight_version = 0  # the policy version the servers hold: actor updates synced into them
        self._serves_adapters = serves_adapters  # rollout/server_lora.py

    def start_agent_loops(self, runner: Any) -> None:
        """Rollouts run through agent loops on the driver from now on, their turns generated by the servers."""
        from verl_like.rollout.token_generate import ServerTokenGenerator

        self.agents = runner
        self._token_generator = ServerTokenGenerator(self.servers, self.config.engine_max_model_len,
                                                     self.config.server.max_concurrent_requests)
        self._token_generator.version = self.weight_version

    def generate(self, prompts: DataProto) -> DataProto:
        """Same meta_info as `ActorRolloutWorker.generate_sequences`: a GenerationRequest. Every server's /health is
        probed first (`_check_servers`); on the driver's thread, a rollout that failed because a supervised server
        died is generated again after its restart."""
        from verl_like.experimental.agent_loop.engine_rollout import rows_use_agent_loops

        sampling = GenerationRequest.from_meta_info(prompts.meta_info).sampling(self.config)
        from verl_like.rollout.server_client import ServerError

        self._check_servers("a rollout")
        while True:
            try:
                if self._serves_adapters:  # the adapter the last sync (or relink) activated (rollout/server_lora.py)
                    self.servers.refresh_adapters()
                if rows_use_agent_loops(self.agents, prompts):
                    out = self.agents.run_sync(prompts, sampling, self._token_generator, self.servers.pad_token_id)
                else:
                    out = self.servers.generate(prompts, sampling)
                break
            except ServerError as err:
                try:
                    revived = self._revive(err)
                except ServerError as capped:  # past server.max_restarts
                    raise ServerError(f"rollout failed: {capped}{self._server_logs()}") from err
                if revived is None:
                    raise ServerError(f"rollout failed: {err}{self._server_logs()}") from err
        out.meta_info.update(TrainRequest(temperature=sampling.log_prob_temperature).to_meta_info())
        if self.supervision is not None:
            out.meta_info.setdefault("metrics", {})["rollout/server_restarts"] = float(self.supervision.restarts)
        return out

    def sync_weights(self) -> list[dict[str, float]]:
        metrics = self._check_servers("a weight sync")  # a relink sends the current weights: it is this sync
        if metrics is None:
            try:
                metrics = self.actor_rollout.sync_weights()
            except Exception as err:  # a server died during the update: restarted, relinked and synced, or raised
                metrics = self._revive(err)
                if metrics is None:
                    raise
        self._set_version(synced_version(metrics, self.weight_version))
        return metrics

    def load_checkpoint(self, directory: str, weight_version: int) -> None:
        """Restores the actor from `directory` and syncs it into the servers as policy version `weight_version`."""
        self.actor_rollout.load_checkpoint(directory, weight_version)
        self._set_version(weight_version)

    def _set_version(self, version: int) -> None:
        self.weight_version = version
        if self._serves_adapters:
            self.servers.refresh_adapters()
        if self._token_generator is not None:  # turns generated from now on carry the new version
            self._token_generator.version = version

    @property
    def restarts(self) -> int:
        """Server restarts so far this run."""
        return self.supervision.restarts if self.supervision is not None else 0

    def recover(self, error: BaseException, restarts_at_launch: int) -> int | None:
        """The asynchronous driver's background rollout failed with `error` (trainer/async_rollout.py; called on the
        driver's thread): restarts the dead started servers and relinks, as a rollout on the driver's thread does.
        Returns the policy version the servers hold, or None when no restart, now or since `restarts_at_launch`,
        explains the failure (the caller raises `error`)."""
        from verl_like.rollout.server_client import ServerError

        if self.supervision is None or not isinstance(error, ServerError):
            return None
        seen = error.__cause__ or error  # generate's "rollout failed: ..." carries server logs after the cause
        try:
            metrics = self._revive(seen)
        except ServerError as capped:  # past server.max_restarts
            raise ServerError(f"rollout failed: {capped}{self._server_logs()}") from error
        if metrics is not None:
            self._set_version(synced_version(metrics, self.weight_version))
        elif self.supervision.restarts == restarts_at_launch:
            return None
        return self.weight_version

    def _check_servers(self, before: str) -> list[dict[str, float]] | None:
        """Before `before` (a rollout, a weight sync): probes every server's /health at once; those that do not
        answer are marked down, and on the driver's thread the dead started ones are restarted and relinked
        (`ServerSupervision.revive_idle`: its metrics, else None)."""
        silent = self.servers.servers.probe_all()
        if not silent or self.supervision is None or threading.current_thread() is not self._driver_thread:
            return None
        return self.supervision.revive_idle(silent, before)

    def _revive(self, error: BaseException) -> list[dict[str, float]] | None:
        """Restarts dead supervised servers (only on the driver's thread); None when nothing was restarted."""
        if self.supervision is None or threading.current_thread() is not self._driver_thread:
            return None
        return self.supervision.revive(error)

    def _server_logs(self) -> str:
        """The tails of dead servers' logs, for an error message."""
        parts = []
        for index, supervisor in enumerate(self.supervisors):
            try:
                if not ray.get(supervisor.alive.remote(), timeout=10):
                    tail = ray.get(supervisor.log_tail.remote(), timeout=10)
                    parts.append(f"\n--- server {index} exited; its log ends:\n{tail}")
            except Exception as err:  # the supervisor itself is gone
                parts.append(f"\n--- server {index}: its supervising actor is gone ({type(err).__name__})")
        return "".join(parts)

    def close(self) -> None:
        if self._token_generator is not None:
            self._token_generator.close()
        self.servers.close()
        for supervisor in self.supervisors:
            try:
                ray.get(supervisor.stop.remote(), timeout=60)
            except Exception as err:  # already dead: its server died with it
                logger.info("server supervisor already gone: %s", err)
            ray.kill(supervisor, no_restart=True)
        self.supervisors = []
        if self.pool is not None:
            self.pool.remove()
            self.pool = None


def start_servers(
    config: Any, model_path: str, server_args: list[str], device: str, cpus_per_process: float,
    ready_timeout_s: float, log_dir: str | None = None, trainer_pool: ResourcePool | None = None,
) -> tuple[list[ServerClient], list[Any], ResourcePool | None]:
    """Clients of the servers `config` (the PPOConfig) names, or of servers started now on `rollout_pool`:
    `launch_servers(...).wait_ready()` (see both)."""
    return launch_servers(config, model_path, server_args, device, cpus_per_process, ready_timeout_s, log_dir,
                          trainer_pool).wait_ready()


class LaunchedServers:
    """Servers `launch_servers` started (or the user's, named by rollout.server.address), not yet known healthy.

    `wait_ready()` waits for each to answer /health and returns (clients, supervisors, the rollout pool this
    created or None); `abort()` ends whatever was started. Either releases the servers on failure.
    """

    def __init__(self, server: Any, started: float, ready_timeout_s: float, supervisors: list[Any] | None = None,
                 address_refs: list[Any] | None = None, host: str = "127.0.0.1", pool: ResourcePool | None = None,
                 addresses: list[str] | None = None, backend: ServerBackend | None = None) -> None:
        self.server = server  # rollout.server
        self.backend = backend  # the servers' protocol (rollout/server_backend.py); None: vLLM's
        self.started = started
        self.ready_timeout_s = ready_timeout_s
        self.supervisors = supervisors or []
        self.address_refs = address_refs or []
        self.host = host
        self.pool = pool
        self.addresses = addresses  # the user's servers (rollout.server.address)

    def wait_ready(self) -> tuple[list[ServerClient], list[Any], ResourcePool | None]:
        """Each server answers /health within server.start_timeout_s (counted from the launch), or ServerError
        names it with its log's tail."""
        from verl_like.rollout.server_client import ServerClient, ServerError

        server = self.server
        if self.addresses is not None:
            clients = [ServerClient(a, f"server {i}", timeout_s=server.request_timeout_s, backend=self.backend)
                       for i, a in enumerate(self.addresses)]
            for client in clients:
                client.wait_healthy(min(server.start_timeout_s, 60.0))
            return clients, [], None
        try:
            addresses = ray.get(self.address_refs, timeout=self.ready_timeout_s)
            if self.host == "0.0.0.0":  # reach each server at its node's address
                nodes = ray.get([s.node_ip.remote() for s in self.supervisors], timeout=self.ready_timeout_s)
                addresses = [a.replace("0.0.0.0", ip) for a, ip in zip(addresses, nodes)]
            clients = [ServerClient(a, f"server {i}", timeout_s=server.request_timeout_s, backend=self.backend)
                       for i, a in enumerate(addresses)]
            for client, supervisor in zip(clients, self.supervisors):
                remaining = max(server.start_timeout_s - (time.monotonic() - self.started), 1.0)
                try:
                    client.wait_healthy(remaining, alive=lambda s=supervisor: ray.get(s.alive.remote(), timeout=30))
                except ServerError as err:
                    tail = ray.get(supervisor.log_tail.remote(), timeout=30)
                    raise ServerError(f"{err}; its log ends:\n{tail}") from err
            logger.info("%d vLLM server(s) ready %.0f s after their launch: %s", len(clients),
                        time.monotonic() - self.started, addresses)
            return clients, self.supervisors, self.pool
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Ends the started servers (their supervisors; each server dies with its supervisor) and their pool."""
        supervisors, self.supervisors = self.supervisors, []
        for supervisor in supervisors:
            ray.kill(supervisor, no_restart=True)
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.remove()


def launch_servers(
    config: Any, model_path: str, server_args: list[str], device: str, cpus_per_process: float,
    ready_timeout_s: float, log_dir: str | None = None, trainer_pool: ResourcePool | None = None,
) -> LaunchedServers:
    """Starts the servers `config` (the PPOConfig) asks for without waiting for them (`LaunchedServers`), so that
    the trainer's workers can start meanwhile; with rollout.server.address, only names the user's servers.

    Started servers run under `VLLMServerActor` actors (each launching the command of rollout.name's ServerBackend),
    one per `tensor_model_parallel_size` devices; all are launched at once, then (in `wait_ready`) each must answer
    /health within server.start_timeout_s (an error names it and shows its log's tail). With rollout_pool.gpu_fraction > 0 they sit on `trainer_pool`'s bundles,
    one each, instead of a pool of their own (config/placement.py); no pool is then returned (the
    trainer's owns it).
    """
    from verl_like.rollout.backends import server_backend
    from verl_like.workers.vllm_server_actor import VLLMServerActor

    server = config.actor_rollout_ref.rollout.server
    backend = server_backend(config.actor_rollout_ref.rollout.name)
    placement = config.placement
    started = time.monotonic()
    if placement.kind is PlacementKind.USER_SERVERS:
        return LaunchedServers(server, started, ready_timeout_s, addresses=list(placement.addresses), backend=backend)
    tp = placement.tp_size
    if placement.shares_trainer_devices:
        if trainer_pool is None:
            raise ValueError("rollout_pool.gpu_fraction > 0 puts the servers on the trainer's pool: pass trainer_pool")
        pool, owned = trainer_pool, None
    else:
        pool = ResourcePool.create(
            [placement.servers_per_node] * placement.nnodes, device=device, cpus_per_process=cpus_per_process,
            name="rollout_pool", ready_timeout_s=ready_timeout_s, gpus_per_process=tp,
        )
        owned = pool
    host = "127.0.0.1" if placement.nnodes == 1 else "0.0.0.0"
    launched = LaunchedServers(server, started, ready_timeout_s, host=host, pool=owned, backend=backend)
    try:
        remote = ray.remote(VLLMServerActor)
        for index, slot in enumerate(pool.slots):
            options = {
                **placement.server_resources(device, cpus_per_process),
                "max_restarts": 0,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(slot.placement_group, slot.bundle_index),
                "name": f"verl_like_rollout_server_{index}_{id(pool)}",
            }
            launched.supervisors.append(
                remote.options(**options).remote(index, model_path, tp, device, host, server_args, log_dir,
                                                 launched.backend)
            )
        launched.address_refs = [s.start.remote() for s in launched.supervisors]
    except BaseException:
        launched.abort()
        raise
    return launched
