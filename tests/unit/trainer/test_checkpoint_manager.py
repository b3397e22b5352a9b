import random

import numpy as np
import pytest
import torch

from verl_like.trainer.checkpoint import CheckpointManager, CheckpointSaveError, rng_state, set_rng_state


def test_commit_points_latest_at_complete_checkpoint_and_prunes(tmp_path):
    manager = CheckpointManager(tmp_path, max_to_keep=2)
    assert manager.latest_step() is None
    for step in (1, 2, 3):
        staging = manager.begin(step)
        (staging / "actor").mkdir()
        manager.commit(step, staging, {"step": step})
    assert manager.latest_step() == 3
    assert manager.load_trainer_state(3) == {"step": 3}
    assert sorted(p.name for p in tmp_path.glob("global_step_*")) == ["global_step_2", "global_step_3"]


def test_crash_before_commit_leaves_previous_checkpoint(tmp_path):
    manager = CheckpointManager(tmp_path)
    staging = manager.begin(1)
    manager.commit(1, staging, {"step": 1})
    staging = manager.begin(2)
    (staging / "partial").write_text("half written")
    # no commit: the run died here
    assert manager.latest_step() == 1
    assert not manager.step_dir(2).exists()


def test_pointer_to_missing_checkpoint_is_reported(tmp_path):
    manager = CheckpointManager(tmp_path)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("7\n")
    with pytest.raises(FileNotFoundError, match="points at step 7"):
        manager.latest_step()


def test_rng_state_round_trip():
    state = rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def _commit_with_parts(manager, step, parts):
    staging = manager.begin(step)
    for part in parts:
        (staging / part).mkdir()
        (staging / part / "weights").write_text(f"{part} {step}")
    manager.commit(step, staging, {"step": step})


def _layout(root):
    return {p.name: sorted(c.name for c in p.iterdir()) for p in sorted(root.glob("global_step_*"))}


def test_actor_and_critic_rotate_on_their_own(tmp_path):
    """max_actor_ckpt_to_keep=3, max_critic_ckpt_to_keep=1: older steps keep the actor only."""
    root = tmp_path
    manager = CheckpointManager(root, part_limits={"actor": 3, "critic": 1})
    for step in (1, 2, 3, 4):
        _commit_with_parts(manager, step, ["actor", "critic"])
    assert _layout(root) == {
        "global_step_2": ["actor", "trainer.pt"],
        "global_step_3": ["actor", "trainer.pt"],
        "global_step_4": ["actor", "critic", "trainer.pt"],
    }
    assert manager.latest_step() == 4


def test_a_step_without_parts_left_is_removed_and_unlimited_parts_stay(tmp_path):
    manager = CheckpointManager(tmp_path, part_limits={"actor": 1, "critic": None})
    for step in (1, 2):
        _commit_with_parts(manager, step, ["actor"])
    assert _layout(tmp_path) == {"global_step_2": ["actor", "trainer.pt"]}
    manager = CheckpointManager(tmp_path / "b", part_limits={"actor": 1, "critic": None})
    for step in (1, 2):
        _commit_with_parts(manager, step, ["actor", "critic"])
    assert _layout(tmp_path / "b") == {
        "global_step_1": ["critic", "trainer.pt"],
        "global_step_2": ["actor", "critic", "trainer.pt"],
    }
    with pytest.raises(ValueError, match=r"part_limits\['critic'\]=0 must be >= 1"):
        CheckpointManager(tmp_path, part_limits={"critic": 0})


def _dcp_checkpoint(directory):
    """A real (single-process) DCP folder plus the extra state file the engine writes."""
    import torch.distributed.checkpoint as dcp

    dcp.save({"w": torch.arange(4096, dtype=torch.float32)}, checkpoint_id=str(directory), no_dist=True)
    torch.save({"global_step": 1}, directory / "extra_state_rank0.pt")


def _commit_dcp(manager, step):
    staging = manager.begin(step)
    (staging / "actor").mkdir()
    _dcp_checkpoint(staging / "actor")
    manager.commit(step, staging, {"step": step})


def test_truncated_shard_of_the_latest_falls_back_to_the_previous_with_a_warning(tmp_path, caplog):
    manager = CheckpointManager(tmp_path)
    _commit_dcp(manager, 1)
    _commit_dcp(manager, 2)
    assert manager.latest_step(required_parts=["actor"]) == 2
    shard = max((manager.step_dir(2) / "actor").glob("*.distcp"), key=lambda p: p.stat().st_size)
    shard.write_bytes(shard.read_bytes()[:100])
    with caplog.at_level("WARNING"):
        assert manager.latest_step(required_parts=["actor"]) == 1
    assert "truncated" in caplog.text and "global_step_1" in caplog.text and shard.name in caplog.text


def test_corrupt_trainer_state_or_pointer_falls_back_and_nothing_good_raises(tmp_path, caplog):
    manager = CheckpointManager(tmp_path)
    for step in (1, 2):
        _commit_with_parts(manager, step, ["actor"])
    (manager.step_dir(2) / "trainer.pt").write_bytes(b"\x80\x02trunc")
    with caplog.at_level("WARNING"):
        assert manager.latest_step() == 1
    assert "global_step_2/trainer.pt does not load" in caplog.text
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("garbage")
    assert manager.latest_step() == 1
    (manager.step_dir(1) / "trainer.pt").unlink()
    with pytest.raises(FileNotFoundError, match=r"no usable checkpoint .*resume_mode=disable"):
        manager.latest_step()


def test_a_step_that_lost_a_required_part_is_skipped(tmp_path):
    manager = CheckpointManager(tmp_path)
    _commit_with_parts(manager, 1, ["actor", "critic"])
    _commit_with_parts(manager, 2, ["actor"])
    assert manager.latest_step(required_parts=["actor", "critic"]) == 1


def test_failed_save_leaves_the_previous_checkpoint_and_says_so(tmp_path):
    import errno

    manager = CheckpointManager(tmp_path)
    _commit_with_parts(manager, 1, ["actor"])

    def disk_full(staging):
        (staging / "actor").mkdir()
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(CheckpointSaveError, match=r"step 2 .*No space left on device.*global_step_1 is intact"):
        manager.save(2, disk_full, {"step": 2})
    assert manager.latest_step() == 1 and not manager.step_dir(2).exists()
    assert not list(tmp_path.glob(".global_step_2*"))  # no staging left behind
    assert manager.save(2, lambda staging: (staging / "actor").mkdir(), {"step": 2}) == manager.step_dir(2)
    assert manager.latest_step() == 2
