"""The rollout handles' weight_version follows the workers' syncs and a restored checkpoint (fake role handle)."""

from __future__ import annotations

from verl_like.trainer.rollout_handle import ColocatedRollout, synced_version


class FakeActorRollout:
    """Reports weight_sync/version as a two-rank group does; remembers load_checkpoint's arguments."""

    def __init__(self) -> None:
        self.version = 0
        self.loaded: list[tuple[str, int]] = []

    def sync_weights(self) -> list[dict[str, float]]:
        self.version += 1
        return [{"weight_sync/version": float(self.version)}, {"weight_sync/version": float(self.version)}]

    def load_checkpoint(self, directory: str, weight_version: int) -> None:
        self.loaded.append((directory, weight_version))
        self.version = weight_version


def test_weight_version_is_the_version_the_workers_synced():
    handle = ColocatedRollout(FakeActorRollout())
    assert handle.weight_version == 0
    handle.sync_weights()
    handle.sync_weights()
    assert handle.weight_version == 2


def test_a_restored_checkpoint_sets_the_version_it_was_saved_at():
    workers = FakeActorRollout()
    handle = ColocatedRollout(workers)
    handle.load_checkpoint("/run/checkpoints/global_step_4/actor", 3)
    assert workers.loaded == [("/run/checkpoints/global_step_4/actor", 3)] and handle.weight_version == 3
    handle.sync_weights()
    assert handle.weight_version == 4


def test_a_sync_without_versions_keeps_the_current_one():
    # A worker whose text hook keeps its own weights reports no weight_sync metrics.
    assert synced_version([{}, {}], current=5) == 5
    assert synced_version([{"weight_sync/version": 6.0}, {}], current=5) == 6
