"""Runs a reward function over many samples in worker processes, each sample under its own time limit.

A sample whose function raises, returns something that is not a finite number, runs past `timeout_s`, or kills
its process gets score 0 and an error note; the call always returns. A worker that overran is killed and replaced
(workers come from a fork server: a replacement starts in milliseconds and inherits no threads or locks of the
caller). The function travels to the workers with cloudpickle, so closures and functions loaded from files work.
"""

from __future__ import annotations

import collections
import logging
import math
import multiprocessing
import signal
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Sequence

import cloudpickle

logger = logging.getLogger(__name__)

RewardFn = Callable[..., Any]  # fn(data_source=, solution_str=, ground_truth=, extra_info=) -> float | {"score": float}


@dataclass(frozen=True)
class ScoreOutcome:
    """The score of one sample; `error` says why it is 0 when the function failed; `timed_out` when it overran."""

    score: float
    error: str | None = None
    timed_out: bool = False


def score_one(fn: RewardFn, kwargs: dict[str, Any]) -> ScoreOutcome:
    """Calls `fn(**kwargs)` and checks its result; exceptions and non-numbers become score 0 with an error."""
    try:
        result = fn(**kwargs)
    except Exception as error:  # a scorer's bug must not stop training
        last = traceback.extract_tb(error.__traceback__)[-1]
        return ScoreOutcome(0.0, f"{type(error).__name__}: {error} (in {last.name}, {last.filename}:{last.lineno})")
    if isinstance(result, dict):
        if "score" not in result:
            return ScoreOutcome(0.0, f"reward function returned a dict without 'score': keys {sorted(result)}")
        result = result["score"]
    if isinstance(result, bool):
        result = float(result)
    if not isinstance(result, (int, float)) or not math.isfinite(float(result)):
        return ScoreOutcome(0.0, f"reward function returned {result!r}; it must return a finite number")
    return ScoreOutcome(float(result))


def _worker_main(conn: Connection, payload: bytes) -> None:
    # Ctrl-C reaches the whole foreground process group; the driver decides when scoring stops (StopRequests
    # lets the step finish), so workers ignore SIGINT. SIGTERM stays fatal: multiprocessing ends daemon children
    # with it at exit (`ray job stop` also sends it; an idle worker it killed is replaced on the next map).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fn = cloudpickle.loads(payload)
    while True:
        message = conn.recv()
        if message is None:
            return
        index, kwargs = message
        outcome = score_one(fn, kwargs)
        conn.send((index, outcome.score, outcome.error))


class _Worker:
    def __init__(self, context: multiprocessing.context.BaseContext, payload: bytes) -> None:
        self.conn, child_conn = context.Pipe()
        self.process = context.Process(target=_worker_main, args=(child_conn, payload), daemon=True)
        self.process.start()
        child_conn.close()
        self.task: int | None = None
        self.started = 0.0

    def kill(self) -> None:
        self.process.kill()
        self.process.join(timeout=5)
        if not self.conn.closed:
            self.conn.close()


class ScoringPool:
    """`num_workers` processes that apply one reward function; `map` scores a list of keyword-argument dicts."""

    def __init__(self, fn: RewardFn, num_workers: int, timeout_s: float) -> None:
        if num_workers < 1:
            raise ValueError(f"reward num_workers={num_workers} must be >= 1 for a process pool")
        if not timeout_s > 0:
            raise ValueError(f"reward timeout_s={timeout_s} must be > 0")
        self.timeout_s = timeout_s
        self._payload = cloudpickle.dumps(fn)
        methods = multiprocessing.get_all_start_methods()
        self._context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        self._workers = [_Worker(self._context, self._payload) for _ in range(num_workers)]

    def _replace(self, slot: int) -> None:
        self._workers[slot].kill()
        self._workers[slot] = _Worker(self._context, self._payload)

    @staticmethod
    def _receive(worker: _Worker) -> tuple[int, float, str | None] | None:
        """The worker's result if one is waiting; None if not (or if its process is gone: then closes the pipe)."""
        if not worker.conn.poll():
            return None
        try:
            return worker.conn.recv()
        except (EOFError, OSError):  # the process exited without answering
            worker.conn.close()
            return None

    def map(self, tasks: Sequence[dict[str, Any]]) -> list[ScoreOutcome]:
        """The outcome of every task, in order; returns within about len(tasks) * timeout_s / num_workers."""
        outcomes: list[ScoreOutcome | None] = [None] * len(tasks)
        pending = collections.deque(range(len(tasks)))
        while pending or any(w.task is not None for w in self._workers):
            for slot, worker in enumerate(self._workers):
                if worker.task is None and pending:
                    if not worker.process.is_alive():  # died while idle (e.g. killed from outside)
                        self._replace(slot)
                        worker = self._workers[slot]
                    index = pending.popleft()
                    try:
                        worker.conn.send((index, tasks[index]))
                    except (BrokenPipeError, OSError):  # died just now: replace it and retry the task
                        self._replace(slot)
                        pending.appendleft(index)
                        continue
                    worker.task, worker.started = index, time.monotonic()
            busy = [w for w in self._workers if w.task is not None]
            if not busy:
                continue
            deadline = min(w.started for w in busy) + self.timeout_s
            waitables = [w.conn for w in busy] + [w.process.sentinel for w in busy]
            wait(waitables, timeout=max(0.0, deadline - time.monotonic()))
            now = time.monotonic()
            for slot, worker in enumerate(self._workers):
                if worker.task is None:
                    continue
                result = self._receive(worker)
                if result is not None:
                    index, score, error = result
                    outcomes[index] = ScoreOutcome(score, error)
                    worker.task = None
                elif not worker.process.is_alive() or worker.conn.closed:
                    worker.process.join(timeout=5)
                    outcomes[worker.task] = ScoreOutcome(
                        0.0, f"reward worker process died (exit code {worker.process.exitcode}) while scoring"
                    )
                    self._replace(slot)
                elif now - worker.started >= self.timeout_s:
                    outcomes[worker.task] = ScoreOutcome(
                        0.0, f"reward function ran past the timeout of {self.timeout_s} s", timed_out=True
                    )
                    self._replace(slot)
        done = [outcome for outcome in outcomes if outcome is not None]
        if len(done) != len(tasks):
            raise RuntimeError(f"ScoringPool.map lost {len(tasks) - len(done)} results; this is a bug")
        return done

    def close(self) -> None:
        """Stops the workers."""
        for worker in self._workers:
            try:
                worker.conn.send(None)
            except (BrokenPipeError, OSError):  # already gone
                pass
        for worker in self._workers:
            worker.process.join(timeout=2)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(timeout=5)
            if not worker.conn.closed:
                worker.conn.close()
        self._workers = []
