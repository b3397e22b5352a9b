"""The rollout batch layout: left-padded prompts in, interleaved right-padded responses out."""

import numpy as np
import pytest
import torch

from verl_like.protocol import DataProto
from verl_like.rollout.base import SamplingConfig
from verl_like.rollout.batch import build_rollout_batch, generation_metrics, prompt_token_lists, rollout_rate

PAD = 0


def left_padded(prompts: list[list[int]], **extra) -> DataProto:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(
        tensors=dict(input_ids=ids, attention_mask=mask, position_ids=positions, **extra.pop("tensors", {})),
        **extra,
    )


def test_prompt_token_lists_strip_left_padding():
    assert prompt_token_lists(left_padded([[5, 6, 7], [8]])) == [[5, 6, 7], [8]]


def test_prompt_token_lists_reject_right_padding_and_empty_rows():
    data = left_padded([[5, 6], [7, 8]])
    data.batch["attention_mask"][1] = torch.tensor([1, 0])
    with pytest.raises(ValueError, match=r"rows \[1\] are not left-padded"):
        prompt_token_lists(data)
    data.batch["attention_mask"][1] = torch.tensor([0, 0])
    with pytest.raises(ValueError, match=r"rows \[1\] have no prompt tokens"):
        prompt_token_lists(data)


def test_prompt_token_lists_name_missing_keys():
    data = DataProto.from_dict(tensors=dict(input_ids=torch.ones(2, 3, dtype=torch.long)))
    with pytest.raises(KeyError, match="attention_mask"):
        prompt_token_lists(data)


def test_build_rollout_batch_layout():
    prompts = left_padded(
        [[5, 6, 7], [8]],
        tensors=dict(score_scale=torch.tensor([1.0, 2.0])),
        non_tensors={"uid": ["a", "b"]},
        meta_info={"metrics": {"data/x": 1.0}, "step": 3},
    )
    sampling = SamplingConfig(n=2, max_tokens=4)
    responses = [[9, 10], [11, 12, 13, 14], [15], [16, 2]]
    log_probs = [[-0.1, -0.2], [-0.3, -0.4, -0.5, -0.6], [-0.7], [-0.8, -0.9]]
    out = build_rollout_batch(prompts, responses, log_probs, sampling, PAD, {"rollout/x": 2.0})

    assert len(out) == 4
    assert out.batch["prompts"].tolist() == [[5, 6, 7], [5, 6, 7], [PAD, PAD, 8], [PAD, PAD, 8]]
    assert out.batch["responses"].tolist() == [[9, 10, 0, 0], [11, 12, 13, 14], [15, 0, 0, 0], [16, 2, 0, 0]]
    assert out.batch["response_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]]
    assert torch.equal(out.batch["input_ids"], torch.cat([out.batch["prompts"], out.batch["responses"]], 1))
    assert out.batch["attention_mask"].tolist()[2] == [0, 0, 1, 1, 0, 0, 0]
    assert out.batch["position_ids"].tolist()[0] == [0, 1, 2, 3, 4, 5, 6]
    assert out.batch["position_ids"].tolist()[3] == [0, 0, 0, 1, 2, 3, 4]
    expected_lp = torch.tensor([[-0.1, -0.2, 0, 0], [-0.3, -0.4, -0.5, -0.6], [-0.7, 0, 0, 0], [-0.8, -0.9, 0, 0]])
    assert torch.allclose(out.batch["rollout_log_probs"], expected_lp)
    assert out.batch["rollout_log_probs"].dtype == torch.float32
    assert out.batch["score_scale"].tolist() == [1.0, 1.0, 2.0, 2.0]
    assert list(out.non_tensor_batch["uid"]) == ["a", "a", "b", "b"]
    assert out.meta_info["step"] == 3
    assert out.meta_info["metrics"] == {"data/x": 1.0, "rollout/x": 2.0}
    assert not np.shares_memory(out.non_tensor_batch["uid"], prompts.non_tensor_batch["uid"])


def test_build_rollout_batch_rejects_overlong_and_miscounted_samples():
    prompts = left_padded([[5]])
    with pytest.raises(ValueError, match="3 tokens and 3 log-probs for max_tokens=2"):
        build_rollout_batch(prompts, [[1, 2, 3]], [[0.0] * 3], SamplingConfig(max_tokens=2), PAD, {})
    with pytest.raises(ValueError, match="expected 2 responses"):
        build_rollout_batch(prompts, [[1]], [[0.0]], SamplingConfig(n=2, max_tokens=2), PAD, {})


def test_generation_metrics_count_tokens_and_leave_the_rate_to_who_sees_the_whole_rollout():
    metrics = generation_metrics([[1, 2], [3, 4, 5, 6]])
    assert metrics == {"rollout/generated_tokens": 6.0, "rollout/mean_response_length": 3.0}


def test_rollout_rate_is_all_tokens_over_the_wall_time():
    assert rollout_rate(6.0, 2.0) == {"rollout/tokens_per_s": 3.0, "rollout/generate_s": 2.0}
    assert rollout_rate(6.0, 0.0)["rollout/tokens_per_s"] == 0.0
