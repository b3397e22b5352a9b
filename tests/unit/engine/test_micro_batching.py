"""MicroBatching: what a forward is told to split by, from the engine's config or the rollout's log_prob_* keys."""

from __future__ import annotations

import pytest

from verl_like.config.rollout import RolloutConfig
from verl_like.engine.config import EngineConfig, MicroBatching
from verl_like.engine.from_config import log_prob_micro_batching


def test_the_engine_config_micro_batches_by_rows_or_by_its_token_budget():
    assert EngineConfig("m", micro_batch_size_per_rank=4).micro_batching == MicroBatching(4, None)
    budget = EngineConfig("m", micro_batch_size_per_rank=4, use_dynamic_bsz=True, max_tokens_per_rank=512)
    assert budget.micro_batching == MicroBatching(4, 512)
    # A budget without use_dynamic_bsz is not used.
    assert EngineConfig("m", micro_batch_size_per_rank=2, max_tokens_per_rank=512).micro_batching == MicroBatching(2)


def test_log_probs_take_the_rollout_keys_and_the_actor_size_where_unset():
    actor = EngineConfig("m", micro_batch_size_per_rank=4, use_dynamic_bsz=True, max_tokens_per_rank=512)
    assert log_prob_micro_batching(RolloutConfig(), actor) == MicroBatching(4, None)  # the rollout's bsz flag rules
    assert log_prob_micro_batching(RolloutConfig(log_prob_micro_batch_size_per_gpu=8), actor) == MicroBatching(8)
    dynamic = RolloutConfig(log_prob_use_dynamic_bsz=True, log_prob_max_token_len_per_gpu=1024)
    assert log_prob_micro_batching(dynamic, actor) == MicroBatching(4, 1024)


def test_an_empty_micro_batch_is_refused():
    with pytest.raises(ValueError, match="micro_batch_size >= 1"):
        MicroBatching(0)


def test_the_micro_batch_count_rounds_up_to_the_engines_multiple():
    import torch
    from tensordict import TensorDict

    from verl_like.engine.micro_batches import plan_micro_batches

    lengths = [5, 3, 4, 2, 6]
    mask = torch.tensor([[1] * n + [0] * (6 - n) for n in lengths])
    rows = TensorDict({"attention_mask": mask}, batch_size=[5])
    assert plan_micro_batches(rows, 2, None, None) == [[0, 1], [2, 3], [4]]
    assert len(plan_micro_batches(rows, 2, None, None, multiple=2)) == 4  # 3 -> 4: pipeline size 2
    one = plan_micro_batches(rows, 8, 100, None)  # every row fits one budget
    two = plan_micro_batches(rows, 8, 100, None, multiple=2)
    assert len(one) == 1 and len(two) == 2 and sorted(i for part in two for i in part) == list(range(5))
    with pytest.raises(ValueError, match=r"1 rows but another needs 2 micro-batches, a multiple of 2 \(the pipeline"):
        plan_micro_batches(rows[:1], 8, 100, None, multiple=2)
