"""`ServerGenerator`: generation through vLLM servers from the driver, the same batch layout as the in-process engine.

One completion request per prompt (token ids in, token ids and processed log-probs out; nothing is
re-tokenised), each sent to the server with the fewest requests in flight, so several servers are data parallel;
failed requests are retried as `ServerPool` says. Prompt i of a call samples with seed `sampling.seed + i * n`, as
the in-process engines do, so a retried request samples what its first try would have.

Each request runs in a thread of the pool; the caller waits for them with a watchdog: a request still running
WATCHDOG_SLACK_S after its deadline (request_timeout_s from its start, which the request's own read timeouts should
already enforce) fails the call naming its server, whatever blocks the thread.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import Any

from verl_like.data.vision import MULTI_MODAL_DATA
from verl_like.protocol import DataProto
from verl_like.rollout.base import SamplingConfig
from verl_like.rollout.batch import build_rollout_batch, generation_metrics, prompt_token_lists, rollout_rate
from verl_like.rollout.server_backend import ServerBackend
from verl_like.rollout.server_client import Completion, ServerClient, ServerError
from verl_like.rollout.server_pool import RetryStats, ServerPool
from verl_like.rollout.server_vision import ServerImages, request_body

logger = logging.getLogger(__name__)

WATCHDOG_SLACK_S = 30.0


class _Request:
    """One prompt's request: when its thread started it (None while queued)."""

    def __init__(self) -> None:
        self.started: float | None = None


class ServerGenerator:
    """Generates through `clients` (one per server); `max_concurrent` bounds the requests in flight.
    `pool_options` go to `ServerPool` (request_timeout_s, request_retries, retry_backoff_s, on_unresponsive,
    health_period_s)."""

    def __init__(self, clients: list[ServerClient], pad_token_id: int, max_concurrent: int = 256,
                 watchdog_slack_s: float = WATCHDOG_SLACK_S, **pool_options: Any) -> None:
        if not clients:
            raise ValueError("ServerGenerator needs at least one server")
        pool_options.setdefault("request_timeout_s", max(client.timeout_s for client in clients))
        self.clients = clients
        self.servers = ServerPool(clients, **pool_options)
        self.pad_token_id = pad_token_id
        self.watchdog_slack_s = watchdog_slack_s
        self._pool = ThreadPoolExecutor(max_workers=max_concurrent, thread_name_prefix="rollout-http")
        self.images = ServerImages()  # image prompts (rollout/server_vision.py)

    @property
    def images_sent(self) -> int:
        """Images sent to the servers: one per image of a prompt, whatever its n."""
        return self.images.images_sent

    def _complete(self, request: _Request, tokens: list[int], params: dict[str, Any], stats: RetryStats,
                  send: Any = None) -> list[Completion]:
        request.started = time.monotonic()
        return self.servers.complete(tokens, params, stats, send=send)

    def _wait(self, futures: list[Future], requests: list[_Request]) -> list[list[Completion]]:
        """The requests' results in order; raises the first failure, or ServerError for a request past its
        deadline plus WATCHDOG_SLACK_S (module doc). Unstarted requests of a failed call are cancelled."""
        limit = self.servers.request_timeout_s + self.watchdog_slack_s
        try:
            pending = set(futures)
            while pending:
                done, pending = wait(pending, timeout=1.0, return_when=FIRST_EXCEPTION)
                for future in done:
                    future.result()  # raises the request's error
                now = time.monotonic()
                stuck = [r for r, f in zip(requests, futures) if f in pending and r.started and now - r.started > limit]
                if stuck:
                    raise ServerError(
                        f"{len(stuck)} generation request(s) made no progress for {limit:.0f} s (request_timeout_s="
                        f"{self.servers.request_timeout_s:g} + {self.watchdog_slack_s:g}); servers {self.clients}, "
                        f"down: {self.servers.down() or 'none'}", timed_out=True)
            return [future.result() for future in futures]
        except BaseException:
            for future in futures:
                future.cancel()
            raise

    def complete_on(self, tokens: list[int], params: dict[str, Any], sticky: dict[str, int],
                    session: str, images: list[Any] | None = None) -> list[Completion]:
        """`complete` for one turn of a multi-turn session: a session's turns go to the server its first turn took
        (whose prefix cache holds the earlier turns) while it is up, the first to the least loaded one; failures are
        retried as every request is (ServerPool). `images` (PIL): the turn's images, one placeholder each in
        `tokens` (the expansion is read back by the agent loop: experimental/agent_loop/vision_turns.py)."""
        send = None
        if images:
            def send(client: ServerClient, timeout_s: float) -> list[Completion]:
                return self.images.send(client, request_body(tokens, images, params), None, f"session {session}",
                                        timeout_s)
        return self.servers.complete(tokens, params, RetryStats(), sticky=sticky, session=session, send=send)

    def generate(self, prompts: DataProto, sampling: SamplingConfig) -> DataProto:
        """Returns the rollout batch for `prompts` (layout in `RolloutEngine`)."""
        token_lists = prompt_token_lists(prompts)
        start = time.perf_counter()
        self.servers.check_health(force=True)  # a server marked down in an earlier call may be back
        stats = RetryStats()
        requests = [_Request() for _ in token_lists]
        sends = ([None] * len(token_lists) if MULTI_MODAL_DATA not in prompts.non_tensor_batch
                 else self.images.senders(prompts, token_lists, sampling.vllm_fields))
        log_probs_field = {ServerBackend.LOG_PROBS_FIELD: sampling.log_probs_request}
        futures = [
            self._pool.submit(self._complete, request, tokens, {**sampling.vllm_fields(index), **log_probs_field},
                              stats, send)
            for index, (request, tokens, send) in enumerate(zip(requests, token_lists, sends))
        ]
        samples = self._wait(futures, requests)
        seconds = time.perf_counter() - start
        responses = [sample.token_ids for group in samples for sample in group]
        log_probs = [sample.log_probs for group in samples for sample in group]
        metrics = generation_metrics(responses)
        metrics.update(rollout_rate(metrics["rollout/generated_tokens"], seconds))  # this client sees every server
        metrics["rollout/requests_retried"] = float(stats.retried)
        if stats.retried:
            logger.warning("%d request(s) were retried in this rollout; first causes: %s", stats.retried,
                           stats.causes)
        return build_rollout_batch(prompts, responses, log_probs if sampling.log_probs else None, sampling,
                                   self.pad_token_id, metrics)

    def refresh_adapters(self) -> None:
        """Each client names the LoRA adapter its server serves now (rollout/server_lora.py; None on a server
        without LoRA): every generation request carries it. After each weight sync, before each rollout."""
        from verl_like.rollout.server_lora import adapter_status

        for client in self.clients:
            try:
                client.lora_name = adapter_status(client).get("active")
            except ServerError as err:  # a server that is down: the pool sends its requests elsewhere
                logger.warning("%s: could not read its active adapter (%s); keeping %s", client, err, client.lora_name)

    def close(self) -> None:
        self.servers.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        for client in self.clients:
            client.close()
