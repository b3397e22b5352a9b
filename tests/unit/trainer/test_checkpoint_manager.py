import random

import numpy as np
import pytest
import torch

from verl_like.trainer.checkpoint import CheckpointManager, rng_state, set_rng_state


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
