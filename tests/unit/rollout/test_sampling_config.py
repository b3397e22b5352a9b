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
    ],
)
def test_invalid_values_raise_with_the_field_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingConfig(**kwargs)


def test_stop_token_ids_become_a_tuple():
    assert SamplingConfig(stop_token_ids=[3, 4]).stop_token_ids == (3, 4)
