"""WeightVersion: a version counts actor updates synced, not optimizer steps (pure logic)."""

from __future__ import annotations

from verl_like.workers.weight_version import WeightVersion


def sync(version: WeightVersion, actor_step: int) -> int:
    number = version.of_sync(actor_step)
    version.synced(actor_step, number)
    return number


def test_each_update_is_one_version_whatever_its_optimizer_steps():
    version = WeightVersion()
    assert sync(version, 0) == 0  # the initial weights
    # 4 mini-batches x 2 epochs: 8 optimizer steps per update, one version each.
    assert [sync(version, 8 * update) for update in range(1, 4)] == [1, 2, 3]


def test_the_same_weights_again_keep_their_version():
    version = WeightVersion()
    sync(version, 0)
    sync(version, 8)
    assert sync(version, 8) == 1  # a relinked server, a reload after a sleep that discarded them
    assert sync(version, 8) == 1


def test_a_failed_sync_records_nothing_so_the_retry_is_still_the_new_version():
    version = WeightVersion()
    sync(version, 0)
    assert version.of_sync(8) == 1  # the send raised: synced() never ran
    assert sync(version, 8) == 1


def test_a_restored_version_continues_from_the_checkpointed_count():
    version = WeightVersion(number=2, actor_step=16)  # resumed: two updates of 8 optimizer steps
    assert sync(version, 16) == 2
    assert sync(version, 24) == 3
