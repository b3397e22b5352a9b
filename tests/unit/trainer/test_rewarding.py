"""How rule scores and reward-model scores combine (reward_model.combine), and what BatchScorer calls."""

import pytest
import torch

from verl_like.protocol import DataProto
from verl_like.rewards.error_policy import FailedSample
from verl_like.rewards.manager import RuleScores
from verl_like.trainer.rewarding import BatchScorer, combine_scores, fill_failed_with_group_mean

RULE = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
RM = torch.tensor([[0.0, 0.25, 0.0], [-0.5, 0.0, 0.0]])


class FakeRewardManager:
    def __init__(self, failed=(), error_policy="fail") -> None:
        self.calls = 0
        self.failed = [FailedSample(i, "x", "boom") for i in failed]
        self.error_policy = error_policy

    def score_batch(self, batch):
        self.calls += 1
        return RuleScores(RULE.clone(), {"reward/score_mean": 0.5}, self.failed)


class FakeRewardModelRole:
    def compute_rm_score(self, batch):
        return DataProto.from_dict(tensors={"rm_scores": RM.clone()})


def test_combine_adds_or_replaces():
    assert torch.equal(combine_scores(RULE, RM, "add"), RULE + RM)
    assert torch.equal(combine_scores(RULE, None, "add"), RULE)
    assert torch.equal(combine_scores(None, RM, "replace"), RM)
    assert torch.equal(combine_scores(RULE, None, "replace"), RULE)  # no reward model: the rule score
    with pytest.raises(ValueError, match="needs the rule scores"):
        combine_scores(None, RM, "add")
    with pytest.raises(ValueError, match="must be one of"):
        combine_scores(RULE, RM, "mean")
    with pytest.raises(ValueError, match="differ in shape"):
        combine_scores(RULE, RM[:, :2], "add")


def test_batch_scorer_add_calls_both_and_reports_rm_metrics():
    manager = FakeRewardManager()
    scored = BatchScorer(manager, FakeRewardModelRole(), "add").score(DataProto())
    assert manager.calls == 1
    assert torch.equal(scored.scores, RULE + RM) and torch.equal(scored.rule_scores, RULE)
    assert scored.metrics == {"reward/score_mean": 0.5, "reward/rm_score_mean": -0.125,
                              "reward/rm_score_max": 0.25, "reward/rm_score_min": -0.5}


def test_batch_scorer_replace_never_calls_the_rule_scorers():
    manager = FakeRewardManager()
    scored = BatchScorer(manager, FakeRewardModelRole(), "replace").score(DataProto())
    assert manager.calls == 0 and scored.rule_scores is None
    assert torch.equal(scored.scores, RM)


def test_batch_scorer_without_a_reward_model_is_the_rule_score():
    scored = BatchScorer(FakeRewardManager(), None, "replace").score(DataProto())
    assert torch.equal(scored.scores, RULE) and scored.rm_scores is None


def test_skip_policy_masks_failed_samples_out_and_gives_them_their_group_mean():
    batch = DataProto.from_dict(tensors={"response_mask": torch.ones(2, 3, dtype=torch.long)},
                                non_tensors={"uid": ["a", "a"]})
    scored = BatchScorer(FakeRewardManager(failed=[1], error_policy="skip"), None, "add").score(batch)
    assert scored.failed.tolist() == [False, True]
    assert batch.batch["response_mask"].tolist() == [[1, 1, 1], [0, 0, 0]]
    assert scored.scores.sum(-1).tolist() == [1.0, 1.0]  # row 1 takes row 0's score: no pull on the baseline


def test_fail_and_zero_policies_keep_the_mask():
    for policy in ("fail", "zero"):
        batch = DataProto.from_dict(tensors={"response_mask": torch.ones(2, 3, dtype=torch.long)})
        scored = BatchScorer(FakeRewardManager(failed=[1], error_policy=policy), None, "add").score(batch)
        assert batch.batch["response_mask"].sum().item() == 6 and torch.equal(scored.scores, RULE)


def test_group_mean_fill_uses_only_scored_peers_of_the_same_group():
    scores = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.5], [0.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1]])
    failed = torch.tensor([False, True, False, True])
    out = fill_failed_with_group_mean(scores, failed, mask, ["a", "a", "b", "b"])
    assert out.tolist() == [[0.0, 1.0], [1.0, 0.0], [0.0, 0.5], [0.0, 0.5]]
    alone = fill_failed_with_group_mean(scores, torch.tensor([True, True, True, True]), mask, None)
    assert alone.sum().item() == 0.0
