"""`RolloutPrefetcher`: the asynchronous driver's rollouts, generated in the background with bounded staleness.

The loop (PPOTrainer) stays the same phases; only where a step's batch comes from changes. One background thread
pulls prompts and generates batches in data order through the servers (`ServerRolloutHandle.generate`), so the
batch of step t+1 is being generated while step t computes log-probs and updates. Rules:
- the batch for step t is launched once step t - K - 1 has trained (t <= s + K with s steps done), at the policy
  version v then held (actor updates synced into the servers, workers/weight_version.py); at most one sync per
  step, so it is generated with weights at most K versions older than the policy that trains on it (checked when
  it is taken, in versions: steps without an actor update, the critic's warm-up, do not age a batch);
- without partial rollout, a weight sync waits until every launched generation has finished (`drain`), so every
  sample of a batch comes from the version it was launched at; with partial rollout the servers freeze in-flight
  requests during the update (vLLM's pause "keep") and they count as generated with the version they started on;
- prompts are drawn from the loader at launch, on the trainer's thread; each launch records the loader's state
  before its draw, so a checkpoint stores the position of the first batch not yet trained on (a resumed run
  regenerates the pending batches: no prompt is lost or repeated);
- a background generation that failed because a started server died is not restarted there (a restart relinks the
  actor group, a worker-group call only the trainer's thread may make): when the trainer's thread takes the batch
  (`next`, `drain`), `recovery.recover` restarts the server there, and every launched batch is generated again in
  order with the weights the servers then hold (recorded with that version), as the synchronous path regenerates a
  broken rollout whole. Only a failure that a restart explains (one now, or one since the batch was launched) is
  regenerated, so the restarts' cap (server.max_restarts) bounds it.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from verl_like.protocol import DataProto

logger = logging.getLogger(__name__)


class BackgroundRecovery(Protocol):
    """What restarts servers for the background thread (trainer/rollout_handle.py:ServerRolloutHandle)."""

    @property
    def restarts(self) -> int:
        """Server restarts so far this run."""

    def recover(self, error: BaseException, restarts_at_launch: int) -> int | None:
        """On the trainer's thread, after a background generation failed with `error`: the policy version the
        servers hold once the dead ones are restarted, or None when no restart (now or since `restarts_at_launch`)
        explains the failure."""


@dataclass
class _Pending:
    step: int
    version: int
    loader_state: dict[str, Any]
    future: Future
    prompts: DataProto
    restarts: int  # server restarts when it was launched


@dataclass(frozen=True)
class PrefetchedBatch:
    """A generated batch and where it came from: the step it is for, the weight version that generated it, how
    long the trainer waited for it and how long its generation took."""

    batch: DataProto
    step: int
    version: int
    wait_s: float
    generate_s: float


class RolloutPrefetcher:
    """Generates the batches of steps start_step.. in the background (module doc).

    generate(prompts, step) -> batch: generates `prompts` for `step` (seeded by step), in the background thread.
    loader: the prompt loader (`next_batch`, `state_dict`). staleness: K. total_steps: nothing is launched past it.
    recovery: restarts dead servers for failed batches (module doc); None raises every failure.
    """

    def __init__(self, generate: Callable[[DataProto, int], DataProto], loader: Any, staleness: int,
                 start_step: int, total_steps: int, recovery: BackgroundRecovery | None = None) -> None:
        self.generate = generate
        self.loader = loader
        self.staleness = staleness
        self.total_steps = total_steps
        self.recovery = recovery
        self._regenerations = 0
        self._next_step = start_step
        self._pending: collections.deque[_Pending] = collections.deque()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout-prefetch")

    def launch(self, steps_done: int, version: int) -> None:
        """Launches every step t with t <= steps_done + K not launched yet (in order, one background thread), each
        recorded as generated with policy `version`."""
        while self._next_step < self.total_steps and self._next_step <= steps_done + self.staleness:
            step = self._next_step
            state = self.loader.state_dict()
            prompts = self.loader.next_batch()
            future = self._thread.submit(self._produce, prompts, step)
            self._pending.append(_Pending(step, version, state, future, prompts, self._restarts()))
            self._next_step += 1

    def _produce(self, prompts: DataProto, step: int) -> tuple[DataProto, float]:
        start = time.perf_counter()
        batch = self.generate(prompts, step)
        return batch, time.perf_counter() - start

    def _restarts(self) -> int:
        return self.recovery.restarts if self.recovery is not None else 0

    def _result(self, pending: _Pending) -> tuple[DataProto, float]:
        """`pending`'s batch and generation time; a failure that a server restart explains regenerates every
        launched batch (module doc), others raise."""
        while True:
            try:
                return pending.future.result()
            except Exception as err:
                version = self.recovery.recover(err, pending.restarts) if self.recovery is not None else None
                if version is None:
                    raise
                logger.warning("async rollout: the batch of step %d failed (%s); generating the %d launched batch(es) "
                               "again with weight version %d", pending.step, str(err).splitlines()[0][:300],
                               len(self._pending), version)
                self._regenerate(version)

    def _regenerate(self, version: int) -> None:
        """Every launched batch again, in order, recorded as generated with `version`; the one still running is
        waited for and dropped (its samples may mix the old server's and the restarted one's)."""
        for pending in self._pending:
            if not pending.future.cancel():
                try:
                    pending.future.result()
                except Exception as err:  # what failed is regenerated below
                    logger.debug("async rollout: dropping the failed batch of step %d: %s", pending.step, err)
        self._regenerations += 1
        restarts = self._restarts()
        for pending in self._pending:
            pending.future = self._thread.submit(self._produce, pending.prompts, pending.step)
            pending.version, pending.restarts = version, restarts

    def next(self, step: int, version: int) -> PrefetchedBatch:
        """The batch of `step` (0-based: `step` steps are done; launching it first if needed), checked to lag the
        current policy `version` by at most K versions."""
        self.launch(step, version)
        if not self._pending or self._pending[0].step != step:
            raise RuntimeError(f"async rollout: asked for step {step}, next launched is "
                               f"{self._pending[0].step if self._pending else None}")
        start = time.perf_counter()
        batch, generate_s = self._result(self._pending[0])
        pending = self._pending.popleft()
        wait_s = time.perf_counter() - start
        lag = version - pending.version
        if not 0 <= lag <= self.staleness:
            raise RuntimeError(f"async rollout: the batch of step {step} was generated with weight version "
                               f"{pending.version}, {lag} versions behind {version} (async_training.staleness="
                               f"{self.staleness})")
        return PrefetchedBatch(batch, step, pending.version, wait_s, generate_s)

    def drain(self) -> float:
        """Waits until every launched generation has finished (before a weight sync); returns the seconds waited.
        A failed generation raises here."""
        start = time.perf_counter()
        while True:  # a regeneration resubmits the batches already waited for too: wait again
            regenerations = self._regenerations
            for pending in self._pending:
                self._result(pending)
            if self._regenerations == regenerations:
                return time.perf_counter() - start

    def loader_state(self) -> dict[str, Any]:
        """The loader's state before the first batch not yet trained on (what a checkpoint stores)."""
        if self._pending:
            return dict(self._pending[0].loader_state)
        return self.loader.state_dict()

    def close(self) -> None:
        for pending in self._pending:
            pending.future.cancel()
        self._thread.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()
