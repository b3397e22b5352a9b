"""rollout.calculate_log_probs: null (auto) asks vLLM for the sampled tokens' log-probs where something reads them
or they are cheap, not on CUDA otherwise; false with algorithm.rollout_is is refused naming both keys (#30).
rollout.log_probs_from: decode unless rescore is asked for, which is refused where it cannot give the same values."""

from __future__ import annotations

import logging

import pytest

from verl_like.config import compose_config, load_config, to_typed
from verl_like.config.rollout_log_probs import choose_calculate_log_probs, resolve_calculate_log_probs
from verl_like.rollout.from_config import sampling_config

SMOKE = ["+trainer=ci_smoke"]


@pytest.mark.parametrize("device, rollout_is, value, reason", [
    ("cpu", False, True, "trainer.device=cpu"),
    ("cuda", False, False, "trainer.device=cuda without algorithm.rollout_is"),
    ("cuda", True, True, "algorithm.rollout_is=true reads them"),
    ("cpu", True, True, "algorithm.rollout_is=true reads them"),
])
def test_auto_asks_for_them_where_they_are_read_or_cheap(device, rollout_is, value, reason):
    chosen, why = choose_calculate_log_probs(device, rollout_is)
    assert chosen is value and reason in why


def _resolved(overrides: list[str]) -> bool:
    # check_paths=False: no GPU here, but trainer.device=cuda is what the decision reads
    return resolve_calculate_log_probs(to_typed(compose_config(SMOKE + overrides))).actor_rollout_ref.rollout


def test_the_loaded_config_carries_the_decision_and_the_sampling_follows_it():
    rollout = load_config(SMOKE, check_paths=False).actor_rollout_ref.rollout
    assert rollout.calculate_log_probs is True and sampling_config(rollout).log_probs is True
    on_gpu = _resolved(["trainer.device=cuda"])
    assert on_gpu.calculate_log_probs is False
    assert sampling_config(on_gpu).log_probs is False and sampling_config(on_gpu, greedy=True).log_probs is False
    assert _resolved(["trainer.device=cuda", "algorithm.rollout_is=true"]).calculate_log_probs is True
    explicit = ["trainer.device=cuda", "actor_rollout_ref.rollout.calculate_log_probs=true"]
    assert _resolved(explicit).calculate_log_probs is True


def test_false_with_rollout_is_is_refused_naming_both_keys():
    with pytest.raises(ValueError, match=r"calculate_log_probs=false but algorithm\.rollout_is=true"):
        load_config(SMOKE + ["actor_rollout_ref.rollout.calculate_log_probs=false", "algorithm.rollout_is=true"],
                    check_paths=False)


def test_the_decision_is_logged_and_resolving_twice_changes_nothing(caplog):
    with caplog.at_level(logging.INFO, logger="verl_like.config.rollout_log_probs"):
        config = load_config(SMOKE, check_paths=False)
    assert "calculate_log_probs=auto: true (trainer.device=cpu" in caplog.text
    assert resolve_calculate_log_probs(config) is config


# rollout.log_probs_from: decode by default; rescore on request, refused where it would not give the decode's values.
RESCORE = ["actor_rollout_ref.rollout.log_probs_from=rescore"]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_decode_is_the_default_and_rescore_is_taken_as_asked(device):
    base = [f"trainer.device={device}", "algorithm.rollout_is=true"]
    assert _resolved(base).log_probs_from == "decode" and not sampling_config(_resolved(base)).rescore
    rollout = _resolved(base + RESCORE)
    assert rollout.log_probs_from == "rescore" and sampling_config(rollout).rescore


def test_rescoring_widens_the_engine_by_one_token_and_validation_sampling_decodes():
    rescore = _resolved(RESCORE + ["actor_rollout_ref.rollout.val_kwargs.temperature=0.6",
                                   "actor_rollout_ref.rollout.val_kwargs.do_sample=true"])
    decode = _resolved([])
    assert rescore.engine_max_model_len == rescore.prompt_length + rescore.response_length + 1
    assert decode.engine_max_model_len == decode.prompt_length + decode.response_length
    assert sampling_config(rescore).rescore and not sampling_config(rescore, validate=True).rescore
    assert sampling_config(rescore, greedy=True).rescore  # greedy log-probs are the plain log-softmax
    # Without log-probs (auto on CUDA without rollout IS) nothing is rescored: the servers are asked for none.
    none = _resolved(["trainer.device=cuda"] + RESCORE)
    assert not sampling_config(none).rescore and sampling_config(none).log_probs_request == "none"


@pytest.mark.parametrize("overrides, message", [
    (["actor_rollout_ref.rollout.temperature=0.7"], r"log_probs_from=rescore scores at temperature 1 .* "
                                                    r"temperature=0\.7"),
    (["actor_rollout_ref.rollout.top_p=0.9"], r"top_p=0\.9"),
    (["actor_rollout_ref.rollout.top_k=20"], r"top_k=20"),
    (["actor_rollout_ref.rollout.max_model_len=256", "data.max_prompt_length=128", "data.max_response_length=128"],
     r"max_model_len=256; set it to at least 257"),
    (["actor_rollout_ref.rollout.mode=server", "async_training.enable=true", "async_training.staleness=1",
      "async_training.partial_rollout=true"],
     r"log_probs_from=rescore cannot give this run's log-probs: async_training\.partial_rollout"),
    (["actor_rollout_ref.rollout.multi_turn.enable=true"], r"cannot give this run's log-probs: agent loops"),
])
def test_rescore_where_it_cannot_apply_is_refused_naming_the_key(overrides, message):
    with pytest.raises(Exception, match=message):
        load_config(SMOKE + RESCORE + overrides, check_paths=False)


def test_an_unknown_source_is_refused():
    with pytest.raises(Exception, match=r"log_probs_from='sometimes' is not one of \('decode', 'rescore'\)"):
        load_config(SMOKE + ["actor_rollout_ref.rollout.log_probs_from=sometimes"], check_paths=False)
