"""recompute_old_log_prob: null (auto) skips the old log-probs' own forward exactly when the update is one optimizer
step over the batch and nothing reads them first; false is refused, naming the key, where it cannot skip (#30)."""

from __future__ import annotations

import logging

import pytest

from verl_like.config import ConfigError, compose_config, load_config, to_typed
from verl_like.config.old_log_prob import resolve_old_log_prob

ONE_STEP = ["+trainer=ci_smoke", "actor_rollout_ref.actor.ppo_mini_batch_size=8"]  # 8 prompts per step


def _recompute(overrides: list[str]) -> bool:
    return load_config(overrides, check_paths=False).actor_rollout_ref.actor.recompute_old_log_prob


@pytest.mark.parametrize("overrides, recompute", [
    ([], False),  # the embedded default: 64 prompts, one mini-batch of 64
    (ONE_STEP, False),
    (["+trainer=ci_smoke"], True),  # 8 prompts in mini-batches of 4: two optimizer steps
    (ONE_STEP + ["actor_rollout_ref.actor.ppo_epochs=2"], True),
    (ONE_STEP + ["algorithm.use_kl_in_reward=true"], True),
    (ONE_STEP + ["algorithm.rollout_is=true"], False),  # the update computes the IS weights from its forward
    (ONE_STEP + ["actor_rollout_ref.actor.recompute_old_log_prob=true"], True),  # explicit wins
])
def test_auto_skips_the_forward_only_for_one_step_over_the_batch(overrides, recompute):
    assert _recompute(overrides) is recompute


@pytest.mark.parametrize("extra, reason", [
    (["actor_rollout_ref.actor.ppo_epochs=2"], "actor.ppo_epochs=2"),
    (["actor_rollout_ref.actor.ppo_mini_batch_size=4"], "ppo_mini_batch_size=4 != data.train_batch_size=8"),
    (["algorithm.use_kl_in_reward=true"], "use_kl_in_reward=true"),
])
def test_false_is_refused_naming_the_key_and_the_reason(extra, reason):
    with pytest.raises((ValueError, ConfigError)) as info:
        load_config(ONE_STEP + extra + ["actor_rollout_ref.actor.recompute_old_log_prob=false"], check_paths=False)
    message = str(info.value)
    assert "actor_rollout_ref.actor.recompute_old_log_prob=false" in message and reason in message
    assert "null (auto) or true" in message


def test_the_decision_is_logged_with_its_reason(caplog):
    with caplog.at_level(logging.INFO, logger="verl_like.config.old_log_prob"):
        load_config(["+trainer=ci_smoke"], check_paths=False)
    assert "recompute_old_log_prob=auto: true (actor.ppo_mini_batch_size=4 != data.train_batch_size=8" in caplog.text


def test_resolving_is_idempotent_and_a_hand_built_config_is_resolved():
    config = load_config(ONE_STEP, check_paths=False)
    assert resolve_old_log_prob(config) is config
    hand_built = to_typed(compose_config(ONE_STEP))
    assert hand_built.actor_rollout_ref.actor.recompute_old_log_prob is None
    assert resolve_old_log_prob(hand_built).actor_rollout_ref.actor.recompute_old_log_prob is False
