"""CallTimeouts: a method's default timeout follows its own earlier calls, not one hour for everything."""

import pytest

from verl_like.config import ConfigError, load_config
from verl_like.single_controller.errors import WorkerTimeoutError
from verl_like.single_controller.timeouts import CallTimeouts


def test_first_call_is_generous_then_a_multiple_of_the_slowest_with_a_floor():
    timeouts = CallTimeouts(first_call_s=900, factor=10, min_s=120)
    key = "hybrid.actor_rollout.generate_sequences"
    assert timeouts.timeout_for(key) == 900
    timeouts.record(key, 2.0)
    assert timeouts.timeout_for(key) == 120  # 10 x 2 s is below the floor
    timeouts.record(key, 30.0)
    timeouts.record(key, 5.0)
    assert timeouts.timeout_for(key) == 300  # the slowest call counts
    assert timeouts.timeout_for("hybrid.actor_rollout.update_actor") == 900  # per method
    assert "10 x its slowest earlier call (30.0 s), at least 120 s" in timeouts.describe(key)


def test_fixed_timeout_ignores_history():
    timeouts = CallTimeouts(fixed_s=60)
    timeouts.record("g.r.m", 1000.0)
    assert timeouts.timeout_for("g.r.m") == 60 and timeouts.describe("g.r.m") == "fixed default 60 s"


def test_trainer_keys_build_the_policy_and_are_checked():
    config = load_config(["+trainer=ci_smoke", "trainer.timeouts.call_timeout_factor=4"], check_paths=False)
    timeouts = CallTimeouts.from_config(config.trainer.timeouts)
    assert timeouts.fixed_s is None and timeouts.factor == 4 and timeouts.min_s == 120
    fixed = load_config(["+trainer=ci_smoke", "trainer.timeouts.worker_call_timeout_s=30"], check_paths=False)
    assert CallTimeouts.from_config(fixed.trainer.timeouts).timeout_for("x") == 30
    with pytest.raises(ConfigError, match=r"trainer.timeouts.min_call_timeout_s=0.0 must be > 0"):
        load_config(["+trainer=ci_smoke", "trainer.timeouts.min_call_timeout_s=0"], check_paths=False)


def test_timeout_error_names_method_ranks_and_the_keys_to_raise():
    err = WorkerTimeoutError("hybrid.actor_rollout.update_actor", [1], 120, "10 x its slowest earlier call (3.0 s)")
    text = str(err)
    assert text.startswith("hybrid.actor_rollout.update_actor: ranks [1] did not finish within 120 s")
    assert "trainer.timeouts.call_timeout_factor" in text and "trainer.timeouts.worker_call_timeout_s" in text
