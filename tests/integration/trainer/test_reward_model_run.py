"""One short PPO run through the real Ray path with every optional trainer feature on at once (the ci_smoke shape):
a reward-model role (a user subclass, through PPOTrainer's reward_model_worker=) added to the rule score, GAE with
a critic, balanced batches, validation samples logged, MFU against a configured peak, and actor and critic
checkpoints rotated on their own."""

from __future__ import annotations

import json
import sys

import ray
import torch

from verl_like.config.loader import load_config
from verl_like.models.tiny import build_tiny_classifier
from verl_like.protocol import DataProto
from verl_like.single_controller import Dispatch, register
from verl_like.trainer.launch import launch
from verl_like.utils.tracking import read_metrics
from verl_like.workers.reward_model import RewardModelWorker

SHIFT = 10.0  # far outside the tiny random classifier's range, so the metrics show the subclass ran


class ShiftedRewardModel(RewardModelWorker):
    """A user's reward-model role: the model's score plus SHIFT (on the same last-token position)."""

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO)
    def compute_rm_score(self, data: DataProto) -> DataProto:
        out = super().compute_rm_score(data)
        scores = out.batch["rm_scores"]
        out.batch["rm_scores"] = torch.where(scores != 0, scores + SHIFT, scores)
        return out


def test_ppo_run_with_a_reward_model_critic_balancing_val_samples_mfu_and_rotation(ray_cluster, tmp_path):
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    rm_dir = build_tiny_classifier(tmp_path / "rm")
    run = tmp_path / "run"
    config = load_config([
        "+trainer=ci_smoke", f"trainer.default_local_dir={run}", "reward_model.scoring_workers=0",
        "reward_model.enable=true", f"reward_model.model.path={rm_dir}", "reward_model.micro_batch_size_per_gpu=3",
        "algorithm.adv_estimator=gae", "trainer.total_training_steps=3", "trainer.test_freq=3",
        "trainer.save_freq=1", "trainer.max_actor_ckpt_to_keep=2", "trainer.max_critic_ckpt_to_keep=1",
        "trainer.log_val_generations=2", "trainer.peak_tflops_per_device=0.001", "trainer.resume_mode=disable",
    ])
    last = launch(config, reward_model_worker=ShiftedRewardModel)
    assert "val/score/mean" in last

    records = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    for record in records:
        # combine=add: each sample's score is its rule score plus its RM score (no overlong penalty here).
        assert abs(record["critic/score/mean"] - record["reward/score_mean"] - record["reward/rm_score_mean"]) < 1e-4
        assert record["reward/rm_score_min"] > SHIFT - 5  # the user's subclass scored
        assert record["balance/imbalance_after"] <= record["balance/imbalance_before"]
        assert record["perf/mfu/actor"] > 0 and record["perf/mfu/critic"] > 0
        assert "critic/vf_loss" in record

    samples = [json.loads(line) for line in (run / "val_generations.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [3]
    assert len(samples[0]["samples"]) == 2
    assert all(isinstance(s["prompt"], str) and s["prompt"] and isinstance(s["score"], float)
               for s in samples[0]["samples"])

    checkpoints = run / "checkpoints"
    layout = {p.name: sorted(c.name for c in p.iterdir()) for p in sorted(checkpoints.glob("global_step_*"))}
    assert layout == {
        "global_step_2": ["actor", "trainer.pt"],
        "global_step_3": ["actor", "critic", "trainer.pt"],
    }
