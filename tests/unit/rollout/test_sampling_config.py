"""SamplingConfig validation names the field and the fix."""

import pytest

from verl_like.rollout.base import SamplingConfig


def test_defaults_sample_with_every_token():
    sampling = SamplingConfig()
    assert not sampling.greedy and sampling.top_k is None and sampling.top_p == 1.0


def test_greedy_is_do_sample_false():
    assert SamplingConfig(do_sample=False, temperature=0.0).greedy


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(n=0), "n=0"),
        (dict(max_tokens=0), "max_tokens=0"),
        (dict(temperature=0.0), "do_sample=False"),
        (dict(top_p=0.0), r"top_p=0.0 must be in \(0, 1\]"),
        (dict(top_p=1.5), "top_p=1.5"),
        (dict(top_k=0), "or None to keep every token"),
        (dict(stop_token_ids=(1, -2)), "stop_token_ids"),
        (dict(log_probs_from="later"), "log_probs_from='later' is not one of"),
        (dict(log_probs_from="rescore", temperature=0.7), r"'rescore' needs temperature 1 .*temperature=0\.7"),
        (dict(log_probs_from="rescore", top_k=5), r"'rescore' needs temperature 1 .*top_k=5"),
    ],
)
def test_invalid_values_raise_with_the_field_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingConfig(**kwargs)


def test_stop_token_ids_become_a_tuple():
    assert SamplingConfig(stop_token_ids=[3, 4]).stop_token_ids == (3, 4)


def test_vllm_fields_seed_each_prompt_and_turn_greedy_into_argmax():
    sampled = SamplingConfig(n=4, temperature=0.7, top_p=0.9, top_k=20, max_tokens=16, stop_token_ids=(5,), seed=100)
    assert sampled.vllm_fields(3) == {"n": 4, "max_tokens": 16, "temperature": 0.7, "top_p": 0.9, "top_k": 20,
                                      "ignore_eos": False, "stop_token_ids": [5], "seed": 100 + 3 * 4}
    greedy = SamplingConfig(temperature=0.7, top_p=0.9, top_k=20, do_sample=False).vllm_fields(0)
    assert (greedy["temperature"], greedy["top_p"], greedy["top_k"]) == (0.0, 1.0, 0) and "seed" not in greedy
    assert SamplingConfig().vllm_fields(0)["top_k"] == 0  # no top-k


def test_rescoring_and_what_a_server_is_asked_for():
    assert SamplingConfig(log_probs_from="rescore").rescore
    assert SamplingConfig(log_probs_from="rescore", do_sample=False, temperature=0.0).rescore
    assert not SamplingConfig(log_probs_from="rescore", log_probs=False).rescore
    assert SamplingConfig().log_probs_request == "decode"
    assert SamplingConfig(log_probs_from="rescore").log_probs_request == "rescore"
    assert SamplingConfig(log_probs=False, log_probs_from="rescore").log_probs_request == "none"
