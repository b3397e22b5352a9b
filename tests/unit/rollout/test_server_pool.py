"""ServerPool's choices on stand-in clients (pure logic; the real servers are in tests/integration/rollout)."""

from __future__ import annotations

import threading
import time

import pytest

from verl_like.rollout.server_client import Completion, ServerError
from verl_like.rollout.server_pool import ServerPool, retryable


class FakeClient:
    """Answers with `script` (an exception to raise, or "ok"), one entry per call, then "ok"."""

    def __init__(self, name: str, script: list | None = None, healthy: bool = True) -> None:
        self.name, self.script, self.is_healthy = name, list(script or []), healthy
        self.calls: list[tuple[list[int], dict]] = []
        self.timeout_s = 60.0

    def __repr__(self) -> str:
        return self.name

    def complete(self, tokens, params, timeout_s=None):
        self.calls.append((tokens, dict(params)))
        step = self.script.pop(0) if self.script else "ok"
        if isinstance(step, Exception):
            raise step
        return [Completion([1, 2], [-0.1, -0.2], "stop")]

    def healthy(self, timeout_s=5.0):
        return self.is_healthy

    def close(self):
        pass


def reset(name):
    return ServerError(f"{name}: POST /verl_like/generate failed: RemoteProtocolError", transport=True)


def http(status):
    return ServerError(f"answered HTTP {status}", status=status)


def test_retryable_errors_are_transport_failures_and_5xx_only():
    assert retryable(reset("s")) and retryable(http(500)) and retryable(http(503))
    assert not retryable(http(400)) and not retryable(http(404))
    assert not retryable(ServerError("timed out after 5 s", timed_out=True))


def test_a_5xx_is_retried_with_the_same_body_and_doubling_backoff():
    client = FakeClient("server 0", [http(500), http(500)])
    pool = ServerPool([client], request_timeout_s=30, request_retries=3, retry_backoff_s=0.05)
    start = time.monotonic()
    assert pool.complete([7, 8], {"seed": 11, "n": 2})[0].token_ids == [1, 2]
    assert time.monotonic() - start >= 0.05 + 0.1
    assert [call for call in client.calls] == [([7, 8], {"seed": 11, "n": 2})] * 3  # same seed every time
    assert pool.down() == {}  # a 5xx answer does not mark the server down


def test_retries_are_bounded_and_the_last_error_names_the_server():
    client = FakeClient("server 0", [http(500)] * 10)
    pool = ServerPool([client], request_timeout_s=30, request_retries=2, retry_backoff_s=0.0)
    with pytest.raises(ServerError, match="HTTP 500"):
        pool.complete([1], {})
    assert len(client.calls) == 3


def test_a_4xx_is_not_retried():
    client = FakeClient("server 0", [http(400)])
    with pytest.raises(ServerError, match="HTTP 400"):
        ServerPool([client], request_timeout_s=30, retry_backoff_s=0.0).complete([1], {})
    assert len(client.calls) == 1


def test_a_server_that_resets_is_marked_down_and_its_request_goes_to_another():
    bad, good = FakeClient("server 0", [reset("server 0")], healthy=False), FakeClient("server 1")
    pool = ServerPool([bad, good], request_timeout_s=30, retry_backoff_s=0.0)
    pool.complete([1], {"seed": 3})
    assert len(bad.calls) == 1 and len(good.calls) == 1
    assert list(pool.down()) == [0] and "RemoteProtocolError" in pool.down()[0]
    for _ in range(4):  # while it is down, every request goes to the other server
        pool.complete([1], {})
    assert len(bad.calls) == 1 and len(good.calls) == 5
    bad.is_healthy = True  # it answers /health again: it takes requests again
    pool.check_health(force=True)
    assert pool.down() == {}


def test_with_every_server_down_the_request_fails_naming_them_all():
    servers = [FakeClient(f"server {i}", [reset(f"server {i}")] * 9, healthy=False) for i in range(2)]
    pool = ServerPool(servers, request_timeout_s=30, request_retries=5, retry_backoff_s=0.0)
    with pytest.raises(ServerError, match=r"no rollout server is up: server 0: .*RemoteProtocolError; server 1: "):
        pool.complete([1], {})


def test_requests_spread_over_servers_by_requests_in_flight():
    release = threading.Event()

    class Slow(FakeClient):
        def complete(self, tokens, params, timeout_s=None):
            release.wait(10)
            return super().complete(tokens, params, timeout_s)

    servers = [Slow("server 0"), Slow("server 1")]
    pool = ServerPool(servers, request_timeout_s=30)
    threads = [threading.Thread(target=pool.complete, args=([i], {})) for i in range(6)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)
    release.set()
    for thread in threads:
        thread.join()
    assert [len(s.calls) for s in servers] == [3, 3]


def test_each_thread_talks_through_a_client_of_its_own_that_drops_connections_before_the_server_does():
    """Issue #32: one httpx client shared by the rollout's threads closed connections under the threads using them
    (`ReadError: [Errno 9] Bad file descriptor` after a 10-minute hang). vLLM's server closes idle connections
    after 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE)."""
    from verl_like.rollout.server_client import KEEPALIVE_S, ServerClient

    client = ServerClient("http://127.0.0.1:9", "server 0")
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(client._http)) for _ in range(3)]
    for thread in threads:
        thread.start()
        thread.join()
    assert len({id(http) for http in seen}) == 3 and client._http is client._http
    assert KEEPALIVE_S < 5.0
    pool = seen[0]._transport._pool
    assert pool._keepalive_expiry == KEEPALIVE_S
    client.close()
    assert all(http.is_closed for http in seen)
    assert not client._http.is_closed  # a closed client's thread gets a fresh one


def test_a_request_blocked_past_its_deadline_fails_the_rollout_naming_the_servers():
    """The watchdog: whatever blocks a request's thread (it ignores its timeouts here), the rollout fails soon
    after request_timeout_s instead of waiting for it."""
    import torch

    from verl_like.protocol import DataProto
    from verl_like.rollout.base import SamplingConfig
    from verl_like.rollout.servers import ServerGenerator

    release = threading.Event()

    class Stuck(FakeClient):
        def complete(self, tokens, params, timeout_s=None):
            release.wait(30)
            return super().complete(tokens, params, timeout_s)

    ones = torch.ones(2, 3, dtype=torch.long)
    prompts = DataProto.from_dict(tensors={"input_ids": ones, "attention_mask": ones, "position_ids": ones.cumsum(-1)})
    servers = ServerGenerator([Stuck("server 0")], pad_token_id=0, watchdog_slack_s=0.5, request_timeout_s=1.0)
    start = time.monotonic()
    try:
        with pytest.raises(ServerError, match=r"2 generation request\(s\) made no progress for 2 s .*\[server 0\]"):
            servers.generate(prompts, SamplingConfig(max_tokens=2))
        assert 1.5 <= time.monotonic() - start < 4
    finally:
        release.set()
        servers.close()


def test_a_server_that_stops_answering_health_during_requests_is_marked_down_and_reported():
    release = threading.Event()

    class Hung(FakeClient):
        def complete(self, tokens, params, timeout_s=None):
            release.wait(10)
            return super().complete(tokens, params, timeout_s)

    hung, idle = Hung("server 0", healthy=False), FakeClient("server 1", healthy=False)
    reported = []
    pool = ServerPool([hung, idle], request_timeout_s=30, on_unresponsive=reported.append, health_period_s=0.05)
    try:
        time.sleep(0.3)  # no request in flight: unanswered probes do not count
        assert pool.down() == {} and reported == []
        thread = threading.Thread(target=pool.complete, args=([1], {}))
        thread.start()
        deadline = time.monotonic() + 5
        while not reported and time.monotonic() < deadline:
            time.sleep(0.05)
        assert reported[:1] == [0] and "stopped answering" in pool.down()[0]
        release.set()
        thread.join()
    finally:
        release.set()
        pool.close()


def test_a_sessions_turns_stick_to_their_server_and_move_when_it_goes_down():
    """Multi-turn sessions (agent loops): later turns go where the first went (its prefix cache), even when
    another server has fewer requests in flight; when that server fails the turn moves and sticks there."""
    servers = [FakeClient("server 0"), FakeClient("server 1")]
    pool = ServerPool(servers, request_timeout_s=30, retry_backoff_s=0.0)
    sticky: dict[str, int] = {}
    pool.complete([1], {}, sticky=sticky, session="a")
    assert sticky == {"a": 0}  # a first turn goes to the least loaded server (ties: the lower index)
    sticky["b"] = 1
    for _ in range(3):  # both idle: without the session, each would go to server 0
        pool.complete([1, 2], {}, sticky=sticky, session="a")
        pool.complete([1, 2], {}, sticky=sticky, session="b")
    assert [len(s.calls) for s in servers] == [4, 3]
    servers[0].script = [reset("server 0")]
    servers[0].is_healthy = False
    pool.complete([1, 2, 3], {}, sticky=sticky, session="a")
    assert sticky["a"] == 1 and list(pool.down()) == [0]
    pool.complete([1, 2, 3, 4], {}, sticky=sticky, session="a")
    assert [len(s.calls) for s in servers] == [5, 5]


def test_between_rollouts_every_server_is_probed_at_once_and_the_silent_ones_marked_down():
    class SlowHealth(FakeClient):
        def healthy(self, timeout_s=5.0):
            self.probed_with = timeout_s
            time.sleep(0.3)
            return self.is_healthy

    clients = [SlowHealth("server 0"), SlowHealth("server 1", healthy=False), SlowHealth("server 2")]
    pool = ServerPool(clients, request_timeout_s=30)
    start = time.monotonic()
    silent = pool.probe_all(timeout_s=1.5)
    assert time.monotonic() - start < 1.0  # in parallel (the silent one is probed twice): not 0.3 + 0.6 + 0.3 s
    assert silent == {1: "no answer on /health within 1.5 s between rollouts"} and list(pool.down()) == [1]
    assert {client.probed_with for client in clients} == {1.5}
    clients[1].is_healthy = True  # back: the next probe marks it up
    assert pool.probe_all() == {} and pool.down() == {}
    pool.close()
