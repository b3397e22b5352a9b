"""Fault suite, rewards: a user reward function that returns NaN and then raises, on the real trainer (Ray, vLLM,
FSDP2 on 2 CPU workers). Failures are counted in training and validation, the run stops naming the failure when
a whole batch errors, and the all-failed step is neither logged nor checkpointed."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl_like.config.loader import load_config
from verl_like.rewards.error_policy import RewardError
from verl_like.trainer.checkpoint import CheckpointManager
from verl_like.trainer.launch import launch
from verl_like.utils.tracking import read_metrics

FLAKY = Path(__file__).with_name("flaky_reward.py")


def test_failing_reward_stops_the_run_and_keeps_the_last_good_checkpoint(ray_cluster, tmp_path):
    run = tmp_path / "run"
    config = load_config([
        "+trainer=ci_smoke", f"trainer.default_local_dir={run}", f"custom_reward_function.path={FLAKY}",
        "reward_model.scoring_workers=0", "trainer.val_before_train=true", "trainer.test_freq=-1",
        "trainer.save_freq=1", "trainer.resume_mode=disable",
    ])
    with pytest.raises(RewardError) as info:
        launch(config)
    message = str(info.value)
    assert "failed for 16 of 16 samples" in message and "ValueError: grader service unavailable" in message
    assert "reward_model.error_policy=zero" in message

    records = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1]  # step 2 (all failed) is not logged
    val = records[0]
    assert val["val/reward/errors"] > 0  # the NaN rows (a third of each batch: within budget) are counted
    assert records[1]["reward/errors"] == 0.0
    assert CheckpointManager(run / "checkpoints").latest_step() == 1  # not a checkpoint of zeros
