"""`ServerRollout`: generation through vLLM servers from the driver, the same batch layout as the in-process engine.

One completion request per prompt (token ids in, token ids and processed log-probs out; nothing is
re-tokenised), each sent to the server with the fewest requests in flight, so several servers are data parallel.
Prompt i of a call samples with seed `sampling.seed + i * n`, as the in-process engines do.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from verl_like.protocol import DataProto
from verl_like.rollout.base import SamplingConfig
from verl_like.rollout.batch import build_rollout_batch, generation_metrics, prompt_token_lists, rollout_rate
from verl_like.rollout.server_client import Completion, ServerClient

logger = logging.getLogger(__name__)


class ServerRollout:
    """Generates through `clients` (one per server); `max_concurrent` bounds the requests in flight."""

    def __init__(self, clients: list[ServerClient], pad_token_id: int, max_concurrent: int = 256) -> None:
        if not clients:
            raise ValueError("ServerRollout needs at least one server")
        self.clients = clients
        self.pad_token_id = pad_token_id
        self._in_flight = [0] * len(clients)
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max_concurrent, thread_name_prefix="rollout-http")

    def _least_loaded(self) -> int:
        with self._lock:
            index = min(range(len(self.clients)), key=lambda i: self._in_flight[i])
            self._in_flight[index] += 1
            return index

    def _complete(self, tokens: list[int], params: dict[str, Any]) -> list[Completion]:
        index = self._least_loaded()
        try:
            return self.clients[index].complete(tokens, params)
        finally:
            with self._lock:
                self._in_flight[index] -= 1

    def complete_on(self, tokens: list[int], params: dict[str, Any], sticky: dict[str, int],
                    session: str) -> list[Completion]:
        """`complete` for one turn of a multi-turn session: a session's turns go to the server its first turn took
        (whose prefix cache holds the earlier turns), the first to the least loaded one."""
        with self._lock:
            index = sticky.get(session)
            if index is None:
                index = min(range(len(self.clients)), key=lambda i: self._in_flight[i])
                sticky[session] = index
            self._in_flight[index] += 1
        try:
            return self.clients[index].complete(tokens, params)
        finally:
            with self._lock:
                self._in_flight[index] -= 1

    def generate(self, prompts: DataProto, sampling: SamplingConfig) -> DataProto:
        """Returns the rollout batch for `prompts` (layout in `RolloutEngine`)."""
        token_lists = prompt_token_lists(prompts)
        start = time.perf_counter()
        futures = [
            self._pool.submit(self._complete, tokens, sampling.vllm_fields(index))
            for index, tokens in enumerate(token_lists)
        ]
        samples = [future.result() for future in futures]
        seconds = time.perf_counter() - start
        responses = [sample.token_ids for group in samples for sample in group]
        log_probs = [sample.log_probs for group in samples for sample in group]
        metrics = generation_metrics(responses)
        metrics.update(rollout_rate(metrics["rollout/generated_tokens"], seconds))  # this client sees every server
        return build_rollout_batch(prompts, responses, log_probs, sampling, self.pad_token_id, metrics)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for client in self.clients:
            client.close()
