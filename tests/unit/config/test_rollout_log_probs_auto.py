"""rollout.calculate_log_probs: null (auto) asks vLLM for the sampled tokens' log-probs where something reads them
or they are cheap, not on CUDA otherwise; false with algorithm.rollout_is is refused naming both keys (#30)."""

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
