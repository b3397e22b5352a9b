"""`RolloutPrefetcher`: the asynchronous driver's rollouts, generated in the background with bounded staleness.

The loop (PPOTrainer) stays the same phases; only where a step's batch comes from changes. One background thread
pulls prompts and generates batches in data order through the servers (`ServerModeRollout.generate`), so the
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
  regenerates the pending batches: no prompt is lost or repeated).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from verl_like.protocol import DataProto

logger = logging.getLogger(__name__)


@dataclass
class _Pending:
    step: int
    version: int
    loader_state: dict[str, Any]
    future: Future


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
    """

    def __init__(self, generate: Callable[[DataProto, int], DataProto], loader: Any, staleness: int,
                 start_step: int, total_steps: int) -> None:
        self.generate = generate
        self.loader = loader
        self.staleness = staleness
        self.total_steps = total_steps
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
            self._pending.append(_Pending(step, version, state, future))
            self._next_step += 1

    def _produce(self, prompts: DataProto, step: int) -> tuple[DataProto, float]:
        start = time.perf_counter()
        batch = self.generate(prompts, step)
        return batch, time.perf_counter() - start

    def next(self, step: int, version: int) -> PrefetchedBatch:
        """The batch of `step` (0-based: `step` steps are done; launching it first if needed), checked to lag the
        current policy `version` by at most K versions."""
        self.launch(step, version)
        if not self._pending or self._pending[0].step != step:
            raise RuntimeError(f"async rollout: asked for step {step}, next launched is "
                               f"{self._pending[0].step if self._pending else None}")
        pending = self._pending.popleft()
        start = time.perf_counter()
        batch, generate_s = pending.future.result()
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
        for pending in self._pending:
            pending.future.result()
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
