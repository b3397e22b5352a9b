"""`ServerPool`: which server takes each generation request, and what happens when a server fails.

- A request goes to the up server with the fewest requests in flight (several servers are data parallel).
- A request that fails below HTTP (refused, reset, disconnected) or with HTTP 5xx is sent again, the same body (the
  same seed, so it samples what the first try would have), after a backoff of `retry_backoff_s` doubling up to
  MAX_BACKOFF_S, at most `request_retries` times, on another up server when there is one.
- A server that failed below HTTP is marked down and takes no request until its /health answers again (probed at
  most every HEALTH_PERIOD_S, with a timeout). With every server down, a request fails naming them all unless one
  answers /health again.
- While requests are in flight, a monitor thread probes every server's /health every HEALTH_PERIOD_S (timeout
  HEALTH_TIMEOUT_S); a server that misses MONITOR_MISSES probes in a row stopped answering: it is marked down and
  `on_unresponsive(index)` (when given; the trainer stops a server it started, so that its requests fail at once
  and it is restarted) hears of it.
- Between rollouts (before each rollout and weight sync, `probe_all`), the trainer probes every server's /health at
  once, two tries of IDLE_PROBE_TIMEOUT_S: an idle server that does not answer is marked down before any request
  meets it (the monitor above only watches while requests are in flight).
- Deadline: every attempt's read timeout is what is left of `request_timeout_s` since the request's first attempt,
  so a request that cannot make progress fails within request_timeout_s (plus one connect timeout) naming the
  server; a 4xx answer or a timeout is not retried.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from verl_like.rollout.server_client import Completion, ServerClient, ServerError

logger = logging.getLogger(__name__)

MAX_BACKOFF_S = 8.0
HEALTH_PERIOD_S = 2.0
HEALTH_TIMEOUT_S = 5.0
MONITOR_MISSES = 3
# An idle server answers /health in milliseconds; a silent one is probed again (ServerSupervision.dead) before the
# trainer restarts it, so a short timeout costs no false restart.
IDLE_PROBE_TIMEOUT_S = 3.0


def retryable(err: ServerError) -> bool:
    """Whether sending the same request again may succeed: the server was unreachable or failed (5xx)."""
    return err.transport or (err.status is not None and err.status >= 500)


@dataclass
class RetryStats:
    """What one rollout call's requests needed: re-sent requests and the errors that caused them."""

    retried: int = 0
    causes: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, cause: str) -> None:
        with self.lock:
            self.retried += 1
            if len(self.causes) < 3 and cause not in self.causes:
                self.causes.append(cause)


class ServerPool:
    """The clients of the rollout's servers, with their state (module doc)."""

    def __init__(self, clients: list[ServerClient], request_timeout_s: float, request_retries: int = 4,
                 retry_backoff_s: float = 0.5, on_unresponsive: Callable[[int], None] | None = None,
                 health_period_s: float = HEALTH_PERIOD_S) -> None:
        if not clients:
            raise ValueError("ServerPool needs at least one server")
        self.clients = clients
        self.request_timeout_s = request_timeout_s
        self.request_retries = request_retries
        self.retry_backoff_s = retry_backoff_s
        self.on_unresponsive = on_unresponsive
        self.health_period_s = health_period_s
        self._in_flight = [0] * len(clients)
        self._down: dict[int, str] = {}  # index -> why it was marked down
        self._probed = [0.0] * len(clients)
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._prober = ThreadPoolExecutor(max_workers=len(clients), thread_name_prefix="rollout-probe")
        self._monitor = threading.Thread(target=self._watch, name="rollout-health", daemon=True)
        self._monitor.start()

    def close(self) -> None:
        self._closed.set()
        self._prober.shutdown(wait=False, cancel_futures=True)

    def _watch(self) -> None:
        """The monitor thread (module doc)."""
        misses = [0] * len(self.clients)
        while not self._closed.wait(self.health_period_s):
            with self._lock:
                busy = sum(self._in_flight) > 0
                down = set(self._down)
            for index, client in enumerate(self.clients):
                if not busy or index in down or client.healthy(HEALTH_TIMEOUT_S):
                    misses[index] = 0
                    continue
                misses[index] += 1
                if misses[index] >= MONITOR_MISSES:
                    misses[index] = 0
                    self.mark_down(index, f"it stopped answering: no answer on /health within {HEALTH_TIMEOUT_S:g} s "
                                          f"{MONITOR_MISSES} times in a row while requests were in flight")
                    if self.on_unresponsive is not None:
                        self.on_unresponsive(index)

    def down(self) -> dict[int, str]:
        with self._lock:
            return dict(self._down)

    def mark_down(self, index: int, cause: str) -> None:
        with self._lock:
            if index in self._down:
                return
            self._down[index] = cause
        logger.warning("%s is down (%s): its requests go to the other servers until it answers /health",
                       self.clients[index], cause)

    def mark_up(self, index: int) -> None:
        with self._lock:
            was = self._down.pop(index, None)
        if was is not None:
            logger.info("%s answers /health again", self.clients[index])

    def check_health(self, force: bool = False) -> None:
        """Probes /health of the servers marked down (each at most every HEALTH_PERIOD_S unless `force`)."""
        now = time.monotonic()
        for index in self.down():
            if not force and now - self._probed[index] < HEALTH_PERIOD_S:
                continue
            self._probed[index] = now
            if self.clients[index].healthy(HEALTH_TIMEOUT_S):
                self.mark_up(index)

    def probe_all(self, timeout_s: float = IDLE_PROBE_TIMEOUT_S) -> dict[int, str]:
        """Probes every server's /health at once (module doc): those that answer within `timeout_s` are up, the
        others marked down; index -> why it is down, for each that did not answer."""
        # Twice: a dead server refuses at once, and a busy machine may delay one answer past a short timeout.
        answers = list(self._prober.map(lambda client: client.healthy(timeout_s) or client.healthy(timeout_s),
                                        self.clients))
        for index, answered in enumerate(answers):
            if answered:
                self.mark_up(index)
            else:
                self.mark_down(index, f"no answer on /health within {timeout_s:g} s between rollouts")
        down = self.down()
        return {index: down[index] for index, answered in enumerate(answers) if not answered and index in down}

    def _acquire(self, avoid: int | None, prefer: int | None = None) -> int:
        """The index of `prefer` when it is up, else of the up server with the fewest requests in flight (not
        `avoid` when another is up), counted in flight. With every server down, probes their /health once; raises ServerError naming them all
        when none answers."""
        for probe in (False, True):
            if probe:
                self.check_health(force=True)
            with self._lock:
                up = [i for i in range(len(self.clients)) if i not in self._down]
                if len(up) > 1 and avoid in up:
                    up.remove(avoid)
                if up:
                    index = prefer if prefer in up else min(up, key=lambda i: self._in_flight[i])
                    self._in_flight[index] += 1
                    return index
                down = dict(self._down)
        named = "; ".join(f"{self.clients[i]}: {cause}" for i, cause in sorted(down.items()))
        raise ServerError(f"no rollout server is up: {named}", transport=True)

    def _release(self, index: int) -> None:
        with self._lock:
            self._in_flight[index] -= 1

    def complete(self, tokens: list[int], params: dict[str, Any], stats: RetryStats | None = None,
                 sticky: dict[str, int] | None = None, session: str | None = None,
                 send: Callable[[ServerClient, float], list[Completion]] | None = None) -> list[Completion]:
        """The samples of one prompt (`ServerClient.complete`), retried on another server as the module doc says.
        With `sticky`, one turn of the multi-turn `session`: it goes to the server that served the session's last
        turn (whose prefix cache holds the earlier turns) while that one is up, and `sticky[session]` records the
        server that answered. `send(client, timeout_s)`: the request instead of `client.complete(tokens, params)`
        (an image prompt: rollout/server_vision.py)."""
        deadline = time.monotonic() + self.request_timeout_s
        avoid: int | None = None
        prefer = sticky.get(session) if sticky is not None else None
        for attempt in range(self.request_retries + 1):
            index = self._acquire(avoid, prefer if attempt == 0 else None)
            client = self.clients[index]
            try:
                timeout_s = max(deadline - time.monotonic(), 1.0)
                completions = (send(client, timeout_s) if send is not None
                               else client.complete(tokens, params, timeout_s=timeout_s))
                if sticky is not None:
                    sticky[session] = index
                return completions
            except ServerError as err:
                left = deadline - time.monotonic()
                if not retryable(err) or attempt == self.request_retries or left <= 0:
                    raise
                if err.transport:
                    self.mark_down(index, str(err))
                backoff = min(self.retry_backoff_s * 2 ** attempt, MAX_BACKOFF_S, left)
                logger.info("retrying a request in %.1f s (attempt %d of %d): %s", backoff, attempt + 2,
                            self.request_retries + 1, err)
                if stats is not None:
                    stats.add(str(err))
                avoid = index
                time.sleep(backoff)
            finally:
                self._release(index)
        raise AssertionError("unreachable: the last attempt returns or raises")
