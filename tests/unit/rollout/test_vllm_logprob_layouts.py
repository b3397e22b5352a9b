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


def _prompt_positions() -> list[dict[int, Logprob] | None]:
    """prompt_logprobs=3: position 0 has none; at position 2 the prompt's own token (4) ranks 6th, an extra entry."""
    return [
        None,
        {8: Logprob(logprob=-0.2, rank=1), 3: Logprob(logprob=-2.0, rank=2), 6: Logprob(logprob=-2.5, rank=3)},
        {4: Logprob(logprob=-6.0, rank=6), 1: Logprob(logprob=-0.7, rank=1), 2: Logprob(logprob=-1.1, rank=2),
         9: Logprob(logprob=-3.0, rank=3)},
    ]


def test_prompt_topk_reads_both_layouts_and_drops_the_prompt_token_outside_the_top_k():
    flat_layout = FlatLogprobs()
    for position in _prompt_positions():
        flat_layout.append(position)
    for layout in (_prompt_positions(), flat_layout):
        assert vllm_compat.prompt_topk_logprobs(layout, 1, 3) == ([8, 3, 6], [-0.2, -2.0, -2.5])
        assert vllm_compat.prompt_topk_logprobs(layout, 2, 3) == ([1, 2, 9], [-0.7, -1.1, -3.0])
    with pytest.raises(RuntimeError, match="rank <= 4"):
        vllm_compat.prompt_topk_logprobs(_prompt_positions(), 1, 4)


def test_prompt_token_log_probs_read_a_scored_sequence_in_both_layouts():
    """prompt_logprobs=0 (a rescoring pass): each position holds its own token; position 0 has none. A position
    whose first flat entry is another token (prompt_logprobs > 0) is searched."""
    sequence = [3, 8, 4]
    scored = [None, {8: Logprob(logprob=-0.2, rank=1)}, {4: Logprob(logprob=-6.0, rank=6)}]
    flat_layout = FlatLogprobs()
    for position in scored:
        flat_layout.append(position)
    wider = FlatLogprobs()
    for position in _prompt_positions():
        wider.append(position)
    for layout in (scored, flat_layout):
        assert vllm_compat.prompt_token_logprobs(layout, sequence, 1) == [-0.2, -6.0]
        assert vllm_compat.prompt_token_logprobs(layout, sequence, 2) == [-6.0]
    assert vllm_compat.prompt_token_logprobs(wider, [0, 3, 4], 1) == [-2.0, -6.0]
    with pytest.raises(RuntimeError, match="3 prompt log-prob positions for 2 tokens"):
        vllm_compat.prompt_token_logprobs(flat_layout, sequence[:2], 1)
