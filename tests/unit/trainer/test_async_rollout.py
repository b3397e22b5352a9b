"""RolloutPrefetcher's bookkeeping (pure logic; a counting loader and an instant generator stand in for the rest)."""

from __future__ import annotations

import threading

import pytest

from verl_like.protocol import DataProto
from verl_like.trainer.async_rollout import RolloutPrefetcher


class CountingLoader:
    """Batch i holds prompt ids [2i, 2i+1]; its state is the number of batches drawn."""

    def __init__(self) -> None:
        self.position = 0

    def next_batch(self) -> DataProto:
        batch = DataProto(meta_info={"prompt_ids": [2 * self.position, 2 * self.position + 1]})
        self.position += 1
        return batch

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


def generated(prompts: DataProto, step: int) -> DataProto:
    return DataProto(meta_info={**prompts.meta_info, "step": step})


def train(prefetcher: RolloutPrefetcher, steps: range, trained: list[int]) -> list[tuple[int, int]]:
    """Runs the loop's order: next batch at the policy version = step, drain, sync (version + 1)."""
    versions = []
    for step in steps:
        got = prefetcher.next(step, version=step)
        assert got.batch.meta_info["step"] == step
        trained.extend(got.batch.meta_info["prompt_ids"])
        versions.append((step, got.version))
        prefetcher.drain()
    return versions


@pytest.mark.parametrize("staleness", [0, 1, 2, 3])
def test_no_batch_lags_more_than_k_versions_and_the_lag_is_k_once_warm(staleness):
    prefetcher = RolloutPrefetcher(generated, CountingLoader(), staleness, start_step=0, total_steps=10)
    trained: list[int] = []
    versions = train(prefetcher, range(10), trained)
    prefetcher.close()
    lags = [step - version for step, version in versions]
    assert all(0 <= lag <= staleness for lag in lags)
    assert lags[staleness:] == [staleness] * (10 - staleness)  # after the first K steps every batch lags by K
    assert trained == list(range(20))  # data order is the synchronous loop's


def test_zero_staleness_generates_each_batch_after_the_previous_sync():
    launched_at: list[int] = []
    loader = CountingLoader()

    def generate(prompts, step):
        launched_at.append(loader.position)
        return generated(prompts, step)

    prefetcher = RolloutPrefetcher(generate, loader, 0, start_step=0, total_steps=4)
    train(prefetcher, range(4), [])
    assert launched_at == [1, 2, 3, 4]  # one batch drawn at a time: nothing runs ahead of the policy


def test_checkpoint_state_resumes_without_losing_or_repeating_prompts():
    """A run killed after step 3's checkpoint (batches 4 and 5 already drawn and generating) resumes at batch 4."""
    loader = CountingLoader()
    prefetcher = RolloutPrefetcher(generated, loader, 2, start_step=0, total_steps=8)
    trained: list[int] = []
    train(prefetcher, range(4), trained)
    saved = prefetcher.loader_state()
    assert loader.position == 6 and saved == {"position": 4}
    prefetcher.close()

    resumed_loader = CountingLoader()
    resumed_loader.load_state_dict(saved)
    resumed = RolloutPrefetcher(generated, resumed_loader, 2, start_step=4, total_steps=8)
    train(resumed, range(4, 8), trained)
    resumed.close()
    assert trained == list(range(16))


def test_a_failed_generation_raises_at_the_drain_before_the_sync():
    def generate(prompts, step):
        if step == 1:
            raise ConnectionError("server 0 is gone")
        return generated(prompts, step)

    prefetcher = RolloutPrefetcher(generate, CountingLoader(), 1, start_step=0, total_steps=4)
    prefetcher.next(0, version=0)  # launches step 1 in the background
    with pytest.raises(ConnectionError, match="server 0 is gone"):
        prefetcher.drain()
    prefetcher.close()


def test_generation_runs_off_the_trainer_thread():
    threads = []

    def generate(prompts, step):
        threads.append(threading.current_thread().name)
        return generated(prompts, step)

    prefetcher = RolloutPrefetcher(generate, CountingLoader(), 1, start_step=0, total_steps=2)
    train(prefetcher, range(2), [])
    prefetcher.close()
    assert threads and all(name.startswith("rollout-prefetch") for name in threads)


def test_steps_without_an_actor_update_do_not_age_a_batch():
    """During the critic's warm-up the policy stays at version 0: the launches still follow the steps (nothing
    stalls), and every batch lags the policy by 0 versions."""
    prefetcher = RolloutPrefetcher(generated, CountingLoader(), 1, start_step=0, total_steps=6)
    warmup = 3
    got = [prefetcher.next(step, version=max(0, step - warmup)) for step in range(6)]
    prefetcher.close()
    assert [b.step for b in got] == list(range(6))
    assert [b.version for b in got] == [0, 0, 0, 0, 0, 1]  # step 4's batch was launched after step 2, at version 0
    assert [max(0, b.step - warmup) - b.version for b in got] == [0, 0, 0, 0, 1, 1]


def test_a_batch_staler_than_k_versions_is_refused():
    prefetcher = RolloutPrefetcher(generated, CountingLoader(), 1, start_step=0, total_steps=4)
    prefetcher.next(0, version=0)  # launches step 1 at version 0
    with pytest.raises(RuntimeError, match="2 versions behind 2"):
        prefetcher.next(1, version=2)  # two syncs in one step would break the bound
    prefetcher.close()


class FakeRecovery:
    """Restarts the dead server on the trainer's thread: `recover` answers `version` when the server is dead (and
    restarts it) or a restart happened since the batch's launch, else None."""

    def __init__(self, version: int) -> None:
        self.version, self.restarts, self.server_dead = version, 0, False
        self.threads: list[str] = []

    def recover(self, error, restarts_at_launch):
        self.threads.append(threading.current_thread().name)
        if self.server_dead:
            self.server_dead = False
            self.restarts += 1
            return self.version
        return self.version if self.restarts > restarts_at_launch else None


def dying_server(recovery: FakeRecovery, dies_at: int, generations: list[int]):
    """A generator whose server dies while it generates step `dies_at` (that attempt and those after it fail
    until the trainer's thread restarts it)."""

    def generate(prompts, step):
        generations.append(step)
        if step == dies_at and not recovery.restarts:
            recovery.server_dead = True
        if recovery.server_dead:
            raise ConnectionError("server 0 is gone")
        return generated(prompts, step)

    return generate


def test_a_server_dying_in_the_background_is_restarted_on_the_trainers_thread_and_the_batches_regenerated():
    """Staleness 2: the server dies while step 1 generates, step 2's batch fails after it. At the drain (the trainer's
    thread) the server is restarted once, and both batches are generated again in order with the version the
    restarted server holds; the data order is unchanged."""
    recovery = FakeRecovery(version=1)
    generations: list[int] = []
    prefetcher = RolloutPrefetcher(dying_server(recovery, 1, generations), CountingLoader(), 2, start_step=0,
                                   total_steps=4, recovery=recovery)
    trained: list[int] = []
    first = prefetcher.next(0, version=0)  # launches steps 1 and 2 in the background
    trained.extend(first.batch.meta_info["prompt_ids"])
    prefetcher.drain()
    assert recovery.restarts == 1 and recovery.threads == ["MainThread"]
    # 1 and 2 again, in order, after the restart (step 2's first try may have been cancelled before it started)
    assert generations[:2] == [0, 1] and generations[-2:] == [1, 2] and generations.count(1) == 2
    for step in (1, 2, 3):
        got = prefetcher.next(step, version=step)
        trained.extend(got.batch.meta_info["prompt_ids"])
        if step < 3:
            assert got.version == 1  # regenerated with the restarted server's weights, not the launch's
    prefetcher.close()
    assert trained == list(range(8))


def test_a_background_failure_no_restart_explains_raises():
    recovery = FakeRecovery(version=0)

    def generate(prompts, step):
        if step == 1:
            raise ConnectionError("HTTP 400 from server 0")
        return generated(prompts, step)

    prefetcher = RolloutPrefetcher(generate, CountingLoader(), 1, start_step=0, total_steps=4, recovery=recovery)
    prefetcher.next(0, version=0)
    with pytest.raises(ConnectionError, match="HTTP 400"):
        prefetcher.next(1, version=1)
    prefetcher.close()
