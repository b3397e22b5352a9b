"""vllm_compat.sampled_logprobs reads both of vLLM's log-prob layouts the same way."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from vllm.logprobs import FlatLogprobs, Logprob  # noqa: E402

from verl_like.rollout import vllm_compat  # noqa: E402

TOKENS = [5, 9, 5, 2]
VALUES = [-0.5, -1.25, -0.125, -3.0]


def per_position() -> list[dict[int, Logprob]]:
    return [{t: Logprob(logprob=v, rank=1)} for t, v in zip(TOKENS, VALUES)]


def flat(extra_top_token: bool = False) -> FlatLogprobs:
    out = FlatLogprobs()
    for position in per_position():
        if extra_top_token:  # logprobs=1: the sampled token first, then the top-1 token
            position = {**position, 7: Logprob(logprob=-0.01, rank=1)}
        out.append(position)
    return out


def test_dict_and_flat_layouts_give_the_same_log_probs():
    assert vllm_compat.sampled_logprobs(TOKENS, per_position()) == VALUES
    assert vllm_compat.sampled_logprobs(TOKENS, flat()) == VALUES
    assert vllm_compat.sampled_logprobs(TOKENS, flat(extra_top_token=True)) == VALUES


def test_flat_layout_that_does_not_lead_with_the_sampled_token_is_refused():
    with pytest.raises(RuntimeError, match="start each position with the sampled token"):
        vllm_compat.sampled_logprobs([6, 9, 5, 2], flat())


def test_length_mismatch_is_refused_in_both_layouts():
    for layout in (per_position(), flat()):
        with pytest.raises(RuntimeError, match="4 logprob entries for 3 tokens"):
            vllm_compat.sampled_logprobs(TOKENS[:3], layout)


def test_the_installed_vllm_offers_flat_logprobs():
    assert vllm_compat.flat_logprobs_kwargs() == {"flat_logprobs": True}
