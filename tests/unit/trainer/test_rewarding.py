"""How rule scores and reward-model scores combine (reward_model.combine), and what BatchScorer calls."""

import pytest
import torch

from verl_like.protocol import DataProto
from verl_like.trainer.rewarding import BatchScorer, combine_scores

RULE = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
RM = torch.tensor([[0.0, 0.25, 0.0], [-0.5, 0.0, 0.0]])


class FakeRewardManager:
    def __init__(self) -> None:
        self.calls = 0

    def score(self, batch):
        self.calls += 1
        return RULE.clone(), {"reward/score_mean": 0.5}


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
