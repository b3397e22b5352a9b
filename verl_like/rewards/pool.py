"""Runs a reward function over many samples in worker processes, each sample under its own time limit.

A sample whose function raises, returns something that is not a finite number, runs past `timeout_s`, or kills
its process gets score 0 and an error note; the call always returns. A worker that overran is killed and replaced.

Workers are fresh interpreters (`python -m verl_like.rewards.pool`, talking over a socket pair): they inherit no
threads or locks of the caller, and, unlike multiprocessing's spawn and forkserver starts, they never import the
caller's main module again, so a user's script without an `if __name__ == "__main__":` guard is not re-run in
every worker. The function travels to the workers with cloudpickle (closures, functions of the main script and
functions loaded from files work), together with the caller's sys.path.
"""

from __future__ import annotations

import collections
import logging
import math
import signal
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Sequence

import cloudpickle

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0  # a fresh interpreter importing the reward function's modules on a loaded machine
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


def _worker_main(conn: Connection) -> None:
    # Ctrl-C reaches the whole foreground process group; the driver decides when scoring stops (StopRequests
    # lets the step finish), so workers ignore SIGINT. SIGTERM stays fatal (`ray job stop` sends it).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.path[:] = conn.recv()  # the caller's, so functions pickled by reference import as they did there
    try:
        fn = cloudpickle.loads(conn.recv_bytes())
    except Exception as error:  # e.g. a module the function needs is not importable here
        conn.send(f"{type(error).__name__}: {error}")
        return
    conn.send(None)  # ready: the time it took to start is not counted against its first task
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the caller closed the pool or exited
            return
        if message is None:
            return
        index, kwargs = message
        outcome = score_one(fn, kwargs)
        conn.send((index, outcome.score, outcome.error))


class _Process:
    """A worker interpreter (subprocess.Popen) with the few calls of multiprocessing.Process the pool uses."""

    def __init__(self, child_fd: int) -> None:
        self._popen = subprocess.Popen(
            [sys.executable, "-m", "verl_like.rewards.pool", str(child_fd)], pass_fds=(child_fd,),
            stdin=subprocess.DEVNULL,
        )

    @property
    def pid(self) -> int:
        return self._popen.pid

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    @property
    def exitcode(self) -> int | None:
        return self._popen.poll()

    def kill(self) -> None:
        if self.is_alive():
            self._popen.kill()

    def join(self, timeout: float | None = None) -> None:
        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass


class _Worker:
    def __init__(self, payload: bytes) -> None:
        ours, theirs = socket.socketpair()
        self.process = _Process(theirs.fileno())
        theirs.close()  # the worker holds the only other end: its exit makes our end readable (EOF)
        self.conn = Connection(ours.detach())
        self.conn.send(list(sys.path))
        self.conn.send_bytes(payload)
        self.task: int | None = None
        self.started = 0.0

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Returns once the worker has loaded the function; RuntimeError if it cannot."""
        if self.conn.poll(timeout_s):
            try:
                error = self.conn.recv()
            except (EOFError, OSError):
                error = f"its process exited with code {self.process.exitcode} while starting (see its stderr)"
        else:
            error = f"it did not start within {timeout_s:g} s"
        if error is not None:
            self.kill()
            raise RuntimeError(f"a reward scoring worker could not load the reward function: {error}")

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
        self._workers = [_Worker(self._payload) for _ in range(num_workers)]  # they start in parallel
        try:
            for worker in self._workers:
                worker.wait_ready()
        except RuntimeError:
            self.close()
            raise

    def _replace(self, slot: int) -> None:
        self._workers[slot].kill()
        self._workers[slot] = _Worker(self._payload)
        self._workers[slot].wait_ready()

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
            # A worker that dies closes its end of the socket: its connection becomes readable (EOF).
            wait([w.conn for w in busy], timeout=max(0.0, deadline - time.monotonic()))
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


if __name__ == "__main__":  # a worker: python -m verl_like.rewards.pool FD
    _worker_main(Connection(int(sys.argv[1])))
