"""ServerSupervision's decisions between rollouts, and the handle's use of them, on stand-ins (no Ray, no server):
a silent started server that is dead or still silent is restarted and relinked, counted, and the relink is the
sync; past max_restarts it stays down (warned once); a relink whose sync check fails ends the run."""

from __future__ import annotations

import logging
import threading

import pytest

from verl_like.rollout.server_client import ServerError
from verl_like.rollout.server_pool import ServerPool
from verl_like.rollout.sync_check import SyncCheckError
from verl_like.trainer import server_supervision
from verl_like.trainer.rollout_handle import ServerRolloutHandle
from verl_like.trainer.server_supervision import ServerSupervision


class Call:
    """Stands in for an actor method: `.remote()` runs `function` (ray.get is the identity in these tests)."""

    def __init__(self, function) -> None:
        self.function = function

    def remote(self):
        return self.function()


class FakeServer:
    """A client and its supervising actor in one: `up` is whether its process runs and answers /health."""

    def __init__(self, name: str, up: bool = True) -> None:
        self.name, self.up, self.restarted = name, up, 0
        self.timeout_s = 60.0
        self.alive = Call(lambda: self.process_runs)
        self.restart = Call(self._restart)
        self.stop = Call(lambda: None)
        self.process_runs = up

    def __repr__(self) -> str:
        return self.name

    def _restart(self) -> str:
        self.restarted += 1
        self.up = self.process_runs = True
        return "http://127.0.0.1:1"

    def healthy(self, timeout_s: float = 5.0) -> bool:
        return self.up

    def wait_healthy(self, timeout_s: float, alive=None) -> float:
        assert self.up
        return 0.0

    def close(self) -> None:
        pass


@pytest.fixture(autouse=True)
def no_ray(monkeypatch):
    monkeypatch.setattr(server_supervision.ray, "get", lambda value, timeout=None: value)


def supervised(servers: list[FakeServer], max_restarts: int = 3, relink=None):
    pool = ServerPool(servers, request_timeout_s=30)
    relinks: list[int] = []

    def default_relink():
        relinks.append(1)
        return [{"weight_sync/version": 2.0, "rollout/sync_check_gap": 1e-6}, {"weight_sync/version": 2.0}]

    supervision = ServerSupervision(servers, pool, relink or default_relink, max_restarts, start_timeout_s=10)
    return supervision, pool, relinks


def test_a_dead_idle_server_is_restarted_before_the_rollout_and_counted(caplog):
    servers = [FakeServer("server 0"), FakeServer("server 1", up=False)]
    supervision, pool, relinks = supervised(servers)
    silent = pool.probe_all()
    assert list(silent) == [1] and "between rollouts" in silent[1] and list(pool.down()) == [1]
    with caplog.at_level(logging.WARNING, logger="verl_like"):
        metrics = supervision.revive_idle(silent, "a rollout")
    assert metrics[0]["rollout/sync_check_gap"] == 1e-6 and relinks == [1]
    assert servers[1].restarted == 1 and servers[0].restarted == 0 and supervision.restarts == 1
    assert pool.down() == {}
    assert "restarted server 1 (cause: its process exited; seen as: the /health check before a rollout" in caplog.text
    assert "sent the current weights to every server again (full sync)" in caplog.text
    assert "sync check gap 1e-06" in caplog.text


def test_a_hung_idle_server_is_restarted_and_a_healthy_pool_is_left_alone():
    servers = [FakeServer("server 0")]
    supervision, pool, relinks = supervised(servers)
    assert pool.probe_all() == {} and supervision.revive_idle({}, "a rollout") is None
    servers[0].up = False  # its process runs but does not answer
    silent = pool.probe_all()
    supervision.revive_idle(silent, "a weight sync")
    assert servers[0].restarted == 1 and relinks == [1] and supervision.restarts == 1


def test_a_server_silent_once_but_answering_again_is_not_restarted():
    servers = [FakeServer("server 0")]
    supervision, pool, relinks = supervised(servers)
    assert supervision.revive_idle({0: "no answer on /health within 3 s between rollouts"}, "a rollout") is None
    assert servers[0].restarted == 0 and relinks == []


def test_past_max_restarts_a_dead_idle_server_stays_down_warned_once(caplog):
    servers = [FakeServer("server 0"), FakeServer("server 1", up=False)]
    supervision, pool, relinks = supervised(servers, max_restarts=0)
    with caplog.at_level(logging.WARNING, logger="verl_like"):
        for _ in range(3):
            assert supervision.revive_idle(pool.probe_all(), "a rollout") is None
    assert servers[1].restarted == 0 and relinks == [] and list(pool.down()) == [1]
    assert caplog.text.count("max_restarts=0 allows no more: they stay down") == 1
    assert "server 1: its process exited" in caplog.text


def test_a_relink_whose_sync_check_fails_ends_the_run():
    """A restarted server serving wrong weights: the relink's sync check raises, and nothing swallows it."""

    def wrong_weights():
        raise SyncCheckError("sync check failed: server 0 (http://127.0.0.1:1) holding version 2 does not serve the "
                             "trainer's policy of version 2")

    servers = [FakeServer("server 0", up=False)]
    supervision, pool, _ = supervised(servers, relink=wrong_weights)
    with pytest.raises(SyncCheckError, match="server 0 .* does not serve the trainer's policy"):
        supervision.revive_idle(pool.probe_all(), "a rollout")
    with pytest.raises(SyncCheckError):  # the same after a failed rollout (revive)
        servers[0].up = servers[0].process_runs = False
        supervision.revive(ServerError("POST /verl_like/generate failed: ConnectError", transport=True))


class FakeActorRollout:
    def __init__(self) -> None:
        self.syncs = 0

    def sync_weights(self):
        self.syncs += 1
        return [{"weight_sync/version": 3.0}]


class FakeServerGenerator:
    def __init__(self, pool: ServerPool) -> None:
        self.servers = pool


def test_a_relink_before_a_weight_sync_is_that_sync():
    servers = [FakeServer("server 0", up=False)]
    supervision, pool, relinks = supervised(servers)
    actor = FakeActorRollout()
    handle = ServerRolloutHandle(None, actor, FakeServerGenerator(pool), servers, supervision=supervision)
    handle.sync_weights()
    assert relinks == [1] and actor.syncs == 0 and handle.weight_version == 2
    handle.sync_weights()  # every server answers: the ordinary sync
    assert relinks == [1] and actor.syncs == 1 and handle.weight_version == 3


def test_off_the_drivers_thread_a_dead_server_is_only_marked_down():
    """The asynchronous driver's background thread: a restart relinks the actor group, a worker-group call only the
    driver's thread may make."""
    servers = [FakeServer("server 0", up=False), FakeServer("server 1")]
    supervision, pool, relinks = supervised(servers)
    handle = ServerRolloutHandle(None, FakeActorRollout(), FakeServerGenerator(pool), servers, supervision=supervision)
    thread = threading.Thread(target=handle._check_servers, args=("a rollout",))
    thread.start()
    thread.join()
    assert list(pool.down()) == [0] and relinks == [] and servers[0].restarted == 0


def test_a_background_rollouts_failure_is_recovered_on_the_drivers_thread_when_a_restart_explains_it():
    servers = [FakeServer("server 0")]
    supervision, pool, relinks = supervised(servers)
    handle = ServerRolloutHandle(None, FakeActorRollout(), FakeServerGenerator(pool), servers, supervision=supervision)
    servers[0].up = servers[0].process_runs = False
    cause = ServerError("no rollout server is up: server 0: ConnectError", transport=True)
    try:
        raise ServerError("rollout failed: no rollout server is up\n--- server 0 exited; its log ends:\n...") from cause
    except ServerError as failed:
        error = failed
    assert handle.recover(error, restarts_at_launch=0) == 2  # restarted now: the relink's version
    assert servers[0].restarted == 1 and relinks == [1] and handle.restarts == 1
    assert handle.recover(error, restarts_at_launch=0) == 2  # a batch launched before that restart
    assert handle.recover(error, restarts_at_launch=1) is None  # launched after it: no restart explains it
    assert handle.recover(ValueError("a bug"), restarts_at_launch=0) is None
