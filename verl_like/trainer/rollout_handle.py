"""What the trainer loop generates with and syncs into, whatever the placement.

`ColocatedRollout`: the engines live in the actor-rollout workers (verl's hybrid engine); both calls go to them.
`ServerModeRollout`: vLLM servers on their own pool (or the user's); the driver sends the requests
(`ServerRollout`) and the actor group's rank 0 sends the weights (`ServerTransport`).
Both return the same DataProto: the rollout layout of `RolloutEngine`, meta_info["temperature"] and rollout/*
metrics. Weights move only in `sync_weights` (and, colocated, when an engine's sleep discarded them).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from verl_like.protocol import DataProto
from verl_like.rollout.request import GenerationRequest
from verl_like.single_controller import ResourcePool
from verl_like.single_controller.worker_group import RoleHandle
from verl_like.trainer.server_placement import server_placement

if TYPE_CHECKING:  # server mode's HTTP client (httpx) is imported only when a run uses servers
    from verl_like.rollout.server_client import ServerClient
    from verl_like.rollout.servers import ServerRollout
    from verl_like.trainer.server_supervision import ServerSupervision

logger = logging.getLogger(__name__)


class ColocatedRollout:
    """The rollout engines inside the actor-rollout workers."""

    def __init__(self, actor_rollout: RoleHandle) -> None:
        self.actor_rollout = actor_rollout

    def generate(self, prompts: DataProto) -> DataProto:
        return self.actor_rollout.generate_sequences(prompts)

    def sync_weights(self) -> list[dict[str, float]]:
        return self.actor_rollout.sync_weights()

    def close(self) -> None:
        try:
            # Release the engines first (on CPU, TP engines hold shared-memory segments).
            self.actor_rollout.close(timeout_s=120)
        except Exception as err:  # a failed run may have lost workers; shutting down must still proceed
            logger.warning("closing the rollout engines failed: %s", err)


class ServerModeRollout:
    """vLLM servers: generation from the driver, weights from the actor group's rank 0 (module doc)."""

    def __init__(self, rollout_config: Any, actor_rollout: RoleHandle, servers: ServerRollout,
                 supervisors: list[Any] | None = None, pool: ResourcePool | None = None,
                 supervision: ServerSupervision | None = None) -> None:
        self.config = rollout_config
        self.actor_rollout = actor_rollout
        self.servers = servers
        self.supervisors = supervisors or []
        self.pool = pool
        self.supervision = supervision  # restarts dead servers we started (trainer/server_supervision.py)
        self._driver_thread = threading.current_thread()  # the one that may restart servers (worker-group calls)

    def generate(self, prompts: DataProto) -> DataProto:
        """Same meta_info as `ActorRolloutWorker.generate_sequences`: a GenerationRequest. On the driver's thread,
        a rollout that failed because a supervised server died is generated again after its restart."""
        sampling = GenerationRequest.from_meta_info(prompts.meta_info).sampling(self.config)
        from verl_like.rollout.server_client import ServerError

        while True:
            try:
                out = self.servers.generate(prompts, sampling)
                break
            except ServerError as err:
                try:
                    revived = self._revive(err)
                except ServerError as capped:  # past server.max_restarts
                    raise ServerError(f"rollout failed: {capped}{self._server_logs()}") from err
                if revived is None:
                    raise ServerError(f"rollout failed: {err}{self._server_logs()}") from err
        out.meta_info["temperature"] = sampling.log_prob_temperature
        if self.supervision is not None:
            out.meta_info.setdefault("metrics", {})["rollout/server_restarts"] = float(self.supervision.restarts)
        return out

    def sync_weights(self) -> list[dict[str, float]]:
        try:
            return self.actor_rollout.sync_weights()
        except Exception as err:  # a server died during the update: restarted, relinked and synced, or raised
            metrics = self._revive(err)
            if metrics is None:
                raise
            return metrics

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
                 addresses: list[str] | None = None) -> None:
        self.server = server  # rollout.server
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
            clients = [ServerClient(a, f"server {i}", timeout_s=server.request_timeout_s)
                       for i, a in enumerate(self.addresses)]
            for client in clients:
                client.wait_healthy(min(server.start_timeout_s, 60.0))
            return clients, [], None
        try:
            addresses = ray.get(self.address_refs, timeout=self.ready_timeout_s)
            if self.host == "0.0.0.0":  # reach each server at its node's address
                nodes = ray.get([s.node_ip.remote() for s in self.supervisors], timeout=self.ready_timeout_s)
                addresses = [a.replace("0.0.0.0", ip) for a, ip in zip(addresses, nodes)]
            clients = [ServerClient(a, f"server {i}", timeout_s=server.request_timeout_s)
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

    Started servers run under `RolloutServerWorker` actors, one per `tensor_model_parallel_size` devices; all are
    launched at once, then (in `wait_ready`) each must answer /health within server.start_timeout_s (an error
    names it and shows its log's tail). With rollout_pool.gpu_fraction > 0 they sit on `trainer_pool`'s bundles,
    one each, instead of a pool of their own (trainer/server_placement.py); no pool is then returned (the
    trainer's owns it).
    """
    from verl_like.workers.rollout_server import RolloutServerWorker

    rollout = config.actor_rollout_ref.rollout
    server = rollout.server
    started = time.monotonic()
    if server.address:
        return LaunchedServers(server, started, ready_timeout_s, addresses=list(server.address))
    tp = rollout.tensor_model_parallel_size
    placement = server_placement(config, device, cpus_per_process)
    if placement.shared:
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
    launched = LaunchedServers(server, started, ready_timeout_s, host=host, pool=owned)
    try:
        remote = ray.remote(RolloutServerWorker)
        for index, slot in enumerate(pool.slots):
            options = {
                **placement.actor_resources(),
                "max_restarts": 0,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(slot.placement_group, slot.bundle_index),
                "name": f"verl_like_rollout_server_{index}_{id(pool)}",
            }
            launched.supervisors.append(
                remote.options(**options).remote(index, model_path, tp, device, host, server_args, log_dir)
            )
        launched.address_refs = [s.start.remote() for s in launched.supervisors]
    except BaseException:
        launched.abort()
        raise
    return launched
