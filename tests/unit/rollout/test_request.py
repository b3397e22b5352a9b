"""GenerationRequest: the typed rollout request behind the "validate" / "do_sample" / "seed" meta_info keys."""

from __future__ import annotations

from verl_like.config.rollout import RolloutConfig
from verl_like.rollout.base import SamplingConfig
from verl_like.rollout.request import GenerationRequest

ROLLOUT = RolloutConfig(n=3, temperature=0.7, response_length=8)


def test_meta_info_round_trip_and_a_plain_rollout_adds_no_keys():
    assert GenerationRequest().to_meta_info() == {}
    request = GenerationRequest(validate=True, greedy=True, seed=11)
    assert request.to_meta_info() == {"validate": True, "do_sample": False, "seed": 11}
    assert GenerationRequest.from_meta_info(request.to_meta_info()) == request
    # What users' code has always written still reads the same.
    assert GenerationRequest.from_meta_info({"do_sample": True, "seed": "5", "other": 1}) == GenerationRequest(seed=5)


def test_a_seeded_chunk_starts_after_the_samples_of_the_prompts_before_it():
    sampling = GenerationRequest(seed=100).sampling(ROLLOUT, prompts_before=4)
    assert sampling.seed == 100 + 4 * 3 and sampling.n == 3 and sampling.temperature == 0.7
    assert GenerationRequest().sampling(ROLLOUT).seed is None


def test_greedy_takes_one_sample_ignores_the_seed_and_scores_at_temperature_one():
    sampling = GenerationRequest(greedy=True, seed=100).sampling(ROLLOUT)
    assert not sampling.do_sample and sampling.n == 1 and sampling.seed is None
    assert sampling.log_prob_temperature == 1.0
    assert SamplingConfig(temperature=0.7).log_prob_temperature == 0.7
