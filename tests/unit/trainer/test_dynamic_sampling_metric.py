"""algorithm.filter_groups.metric: "acc" compares the rule scorer's score, "score" the final one (rule + reward
model). The trainer's dynamic-sampling loop runs here on fake workers (no Ray, no models)."""

import numpy as np
import pytest
import torch

from verl_like.config.loader import load_config
from verl_like.protocol import DataProto
from verl_like.rewards.error_policy import FailedSample
from verl_like.rewards.manager import RuleScores
from verl_like.trainer.ppo_trainer import PPOTrainer
from verl_like.trainer.rewarding import BatchScorer
from verl_like.trainer.rollout_handle import ColocatedRollout
from verl_like.trainer.setup import TrainerComponents

PROMPTS, N, RESPONSE_LEN = 8, 2, 3


class FakeLoader:
    def next_batch(self) -> DataProto:
        return DataProto.from_dict(tensors={"input_ids": torch.ones(PROMPTS, 2, dtype=torch.long)})


class FakeActorRollout:
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        rows = len(prompts) * N
        return DataProto.from_dict(
            tensors={"responses": torch.ones(rows, RESPONSE_LEN, dtype=torch.long),
                     "response_mask": torch.ones(rows, RESPONSE_LEN, dtype=torch.long)},
            non_tensors={"uid": np.repeat(prompts.non_tensor_batch["uid"], N)},
        )


class FakeRewardManager:
    def __init__(self, all_fail: bool = False) -> None:
        self.all_fail = all_fail
        self.error_policy = "zero"

    def score_batch(self, batch):
        scores = torch.zeros(len(batch), RESPONSE_LEN)
        if self.all_fail:
            failed = [FailedSample(i, "x", "ValueError: boom") for i in range(len(batch))]
            return RuleScores(scores, {"reward/errors": float(len(batch))}, failed)
        scores[:, -1] = 1.0  # every sample correct: no group has rule-score variance
        return RuleScores(scores, {"reward/errors": 0.0}, [])


class FakeRewardModel:
    def compute_rm_score(self, batch):
        rm = torch.zeros(len(batch), RESPONSE_LEN)
        # Samples differ within every other group (group g holds rows 2g, 2g+1).
        rm[:, -1] = torch.tensor([0.5 * (row % 2) * ((row // N) % 2) for row in range(len(batch))])
        return DataProto.from_dict(tensors={"rm_scores": rm})


def _trainer(metric: str, all_fail: bool = False, reward_model: bool = True) -> PPOTrainer:
    rm = ["reward_model.enable=true", "reward_model.model.path=/unused"] if reward_model else []
    config = load_config(["+trainer=ci_smoke", "algorithm.filter_groups.enable=true",
                          f"algorithm.filter_groups.metric={metric}", "algorithm.filter_groups.max_num_gen_batches=3",
                          *rm], check_paths=False)
    trainer = PPOTrainer(config)
    actor_rollout = FakeActorRollout()
    trainer.components = TrainerComponents(
        actor_rollout=actor_rollout, rollout=ColocatedRollout(actor_rollout), critic=None,
        reward_manager=FakeRewardManager(all_fail), train_loader=FakeLoader(), val_loader=None, needs_reference=False,
        world_size=2, total_training_steps=1, reward_model=FakeRewardModel() if reward_model else None,
    )
    trainer._scorer = BatchScorer(trainer.components.reward_manager, trainer.components.reward_model, "add")
    return trainer


def test_score_keeps_the_groups_the_reward_model_makes_differ():
    metrics: dict[str, float] = {}
    batch = _trainer("score")._collect_rollouts({}, metrics)
    assert metrics["dynamic_sampling/gen_batches"] == 2  # 4 of 8 groups kept per generation round
    assert len(batch) == PROMPTS * N
    sequence_scores = batch.batch["token_level_scores"].sum(-1).view(-1, N)
    assert torch.all(sequence_scores[:, 0] != sequence_scores[:, 1])
    assert torch.all(batch.batch["acc"] == 1.0)


def test_acc_compares_the_rule_score_alone_and_fails_when_no_group_varies():
    with pytest.raises(RuntimeError, match=r"kept 0 of the 8 groups needed after algorithm.filter_groups"):
        _trainer("acc")._collect_rollouts({}, {})


def test_when_every_reward_failed_the_error_blames_the_reward_function_not_the_task():
    with pytest.raises(RuntimeError, match=r"kept 0 of the 8 groups.*48 of the 48 samples scored failed") as info:
        _trainer("acc", all_fail=True, reward_model=False)._collect_rollouts({}, {})
    assert "too easy/hard" not in str(info.value)
    assert "reward_model.error_policy=fail let them through" in str(info.value)
