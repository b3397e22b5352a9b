"""`ServerSupervision`: servers the trainer started are restarted when they die, up to `server.max_restarts` per run.

A restart happens on the driver's own thread, between worker-group calls (a full weight sync is one, and two
threads issuing calls to the same FSDP ranks could order their collectives differently): when a rollout the driver
runs itself (synchronous training, validation) or a weight sync fails and a supervised server is dead or down, or,
before such a rollout or sync, when the servers' /health probe (`ServerPool.probe_all`) finds one silent and it is
dead or still silent (`revive_idle`; past max_restarts it then stays down and its requests go to the others).
A server that stops answering /health while requests are in flight (`ServerPool`'s monitor) is ended first, so
that its requests fail at once instead of after request_timeout_s. Each dead server is launched again by its supervising actor on its bundle and port, must answer /health within
`server.start_timeout_s`, then the actor group links to every server again and sends the current weights (a full
sync through its transport); the failed rollout is then generated again whole (same seeds, the same weights: it
samples what it would have). Servers at `server.address` are the user's and are never restarted (their requests
go to the remaining servers while they are down). Past max_restarts the run ends with the error that triggered
it. Each restart is logged with the server, its cause and how long it took.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import ray

from verl_like.rollout.server_client import ServerError
from verl_like.rollout.server_pool import ServerPool

logger = logging.getLogger(__name__)


def sync_check_gap(metrics: list[dict[str, float]]) -> str:
    """The largest rollout/sync_check_gap of a sync's per-rank metrics, for a log line ("off" without one)."""
    gaps = [m["rollout/sync_check_gap"] for m in metrics if m and "rollout/sync_check_gap" in m]
    return f"{max(gaps):.3g}" if gaps else "off"


def last_line(error: BaseException, chars: int = 300) -> str:
    """The last line of `error`'s message (a worker's error carries the remote traceback before it)."""
    lines = [line for line in str(error).splitlines() if line.strip()]
    return (lines[-1] if lines else type(error).__name__)[:chars]


class ServerSupervision:
    """Restarts dead supervised servers (module doc).

    supervisors: the `VLLMServerActor` actors, one per server in `pool.clients` order. relink(): links the
    actor group to the servers again and sends the current weights; returns its weight_sync metrics.
    """

    def __init__(self, supervisors: list[Any], pool: ServerPool, relink: Callable[[], list[dict[str, float]]],
                 max_restarts: int, start_timeout_s: float) -> None:
        self.supervisors = supervisors
        self.pool = pool
        self.relink = relink
        self.max_restarts = max_restarts
        self.start_timeout_s = start_timeout_s
        self.restarts = 0
        self._warned_capped = False

    def stop_unresponsive(self, index: int) -> None:
        """ServerPool's monitor found server `index` hung (any thread): ends its process, so that its requests fail
        at once and the driver's thread restarts it."""
        logger.warning("%s stopped answering /health: ending its process so that it is restarted",
                       self.pool.clients[index])
        self.supervisors[index].stop.remote()

    def dead(self) -> dict[int, str]:
        """index -> cause, for each supervised server whose process exited or that is marked down and does not
        answer /health."""
        found = {}
        down = self.pool.down()
        for index, supervisor in enumerate(self.supervisors):
            try:
                alive = ray.get(supervisor.alive.remote(), timeout=30)
            except Exception as err:  # the supervising actor itself is gone: its server died with it
                found[index] = f"its supervising actor is gone ({type(err).__name__})"
                continue
            if not alive:
                found[index] = "its process exited"
            elif index in down and not self.pool.clients[index].healthy():
                found[index] = f"it stopped answering ({down[index]})"
        return found

    def revive(self, error: BaseException) -> list[dict[str, float]] | None:
        """Restarts the dead supervised servers after `error`; returns the relink's weight_sync metrics, or None
        when no supervised server is dead (the caller raises `error`). Past max_restarts raises ServerError naming
        the dead servers."""
        if not self.supervisors:
            return None
        dead = self.dead()
        if not dead:
            return None
        return self._restart(dead, error)

    def revive_idle(self, silent: dict[int, str], before: str) -> list[dict[str, float]] | None:
        """Before `before` (a rollout, a weight sync; driver's thread): `silent` (index -> why, from
        ServerPool.probe_all) did not answer /health. Restarts the supervised servers that are dead or still silent
        as `revive` does and returns the relink's metrics; None when none is dead, or when max_restarts allows no
        more restarts (warned once: they stay down, their requests go to the other servers, and a rollout with none
        left fails naming them)."""
        if not silent or not self.supervisors:
            return None
        dead = self.dead()
        if not dead:
            return None
        if self.restarts + len(dead) > self.max_restarts:
            if not self._warned_capped:
                self._warned_capped = True
                named = "; ".join(f"{self.pool.clients[i]}: {cause}" for i, cause in sorted(dead.items()))
                logger.warning("%d rollout server(s) found dead before %s (%s), but %d restart(s) were made and "
                               "actor_rollout_ref.rollout.server.max_restarts=%d allows no more: they stay down",
                               len(dead), before, named, self.restarts, self.max_restarts)
            return None
        named = "; ".join(f"{self.pool.clients[i]}: {cause}" for i, cause in sorted(silent.items()))
        return self._restart(dead, ServerError(f"the /health check before {before} ({named})"))

    def _restart(self, dead: dict[int, str], error: BaseException) -> list[dict[str, float]]:
        """Restarts the `dead` servers (index -> cause) and relinks (module doc); ServerError past max_restarts."""
        if self.restarts + len(dead) > self.max_restarts:
            named = "; ".join(f"{self.pool.clients[i]}: {cause}" for i, cause in sorted(dead.items()))
            raise ServerError(
                f"{last_line(error)}; {len(dead)} rollout server(s) died ({named}) after {self.restarts} restart(s) "
                f"this run, and actor_rollout_ref.rollout.server.max_restarts={self.max_restarts} allows no more"
            ) from error
        for index, cause in sorted(dead.items()):
            start = time.monotonic()
            supervisor = self.supervisors[index]
            ray.get(supervisor.restart.remote(), timeout=60)
            client = self.pool.clients[index]
            client.wait_healthy(self.start_timeout_s, alive=lambda s=supervisor: ray.get(s.alive.remote(), timeout=30))
            self.pool.mark_up(index)
            self.restarts += 1
            logger.warning("restarted %s (cause: %s; seen as: %s) in %.1f s; restart %d of max_restarts=%d", client,
                           cause, last_line(error), time.monotonic() - start, self.restarts, self.max_restarts)
        start = time.monotonic()
        metrics = self.relink()  # its sync check (rollout/sync_check.py) raises when a server serves wrong weights
        logger.warning("sent the current weights to every server again (full sync) in %.1f s; sync check gap %s",
                       time.monotonic() - start, sync_check_gap(metrics))
        return metrics
