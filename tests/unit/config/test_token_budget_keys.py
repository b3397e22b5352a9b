"""Null token-budget keys: which passes are sized from free memory, when not, and that set values stay (#30)."""

from __future__ import annotations

import pytest

from verl_like.config import load_config
from verl_like.config.actor import FALLBACK_TOKEN_BUDGET
from verl_like.config.token_budget import auto_budget_blocker, auto_budget_passes, longest_sequence
from verl_like.engine.from_config import actor_engine_config, log_prob_micro_batching, reference_engine_config

A = "actor_rollout_ref"
SMOKE = ["+trainer=ci_smoke"]
GPU = ["trainer.device=cuda", f"{A}.model.use_remove_padding=true"]
DYNAMIC = [f"{A}.actor.use_dynamic_bsz=true", f"{A}.rollout.log_prob_use_dynamic_bsz=true",
           f"{A}.ref.log_prob_use_dynamic_bsz=true", f"{A}.actor.use_kl_loss=true"]


def _config(overrides: list[str]):
    return load_config(SMOKE + overrides, check_paths=False)


def test_every_null_dynamic_budget_is_sized_on_cuda():
    config = _config(GPU + DYNAMIC)
    assert auto_budget_passes(config) == ("update", "log_prob", "ref_log_prob")
    assert auto_budget_blocker(config) is None
    assert longest_sequence(config) == config.data.max_prompt_length + config.data.max_response_length


def test_a_budget_set_by_the_user_is_not_sized_and_reaches_the_engine_unchanged():
    config = _config(GPU + DYNAMIC + [f"{A}.actor.ppo_max_token_len_per_gpu=3000",
                                      f"{A}.rollout.log_prob_max_token_len_per_gpu=5000"])
    assert auto_budget_passes(config) == ("ref_log_prob",)
    arr = config.actor_rollout_ref
    engine = actor_engine_config(arr.actor, "tiny")
    assert engine.max_tokens_per_rank == 3000
    assert log_prob_micro_batching(arr.rollout, engine, sized_budget=99_000).max_tokens == 5000


def test_passes_without_token_micro_batches_are_not_sized():
    assert auto_budget_passes(_config(GPU)) == ()  # use_dynamic_bsz off everywhere (the default)
    assert auto_budget_passes(_config(GPU + DYNAMIC[:1])) == ("update",)


@pytest.mark.parametrize("overrides, reason", [
    ([], "trainer.device=cpu"),
    (["trainer.device=cuda"], "use_remove_padding=false"),
    (GPU + [f"{A}.actor.strategy=megatron", f"{A}.model.use_remove_padding=false"], "actor.strategy=megatron"),
    (GPU + ["algorithm.adv_estimator=gae"], "a critic trains on the same devices"),
    (GPU + ["distillation.enable=true", "distillation.teacher.path=tiny_teacher"], "distillation.enable"),
])
def test_when_null_budgets_keep_the_fallback(overrides, reason):
    assert reason in auto_budget_blocker(_config(DYNAMIC + overrides))


def test_null_budgets_start_at_the_fallback_in_every_engine_config():
    config = _config(DYNAMIC)  # CPU: what every CPU run uses, as before the keys became null
    arr = config.actor_rollout_ref
    engine = actor_engine_config(arr.actor, "tiny")
    assert engine.max_tokens_per_rank == FALLBACK_TOKEN_BUDGET == 16384
    assert log_prob_micro_batching(arr.rollout, engine).max_tokens == FALLBACK_TOKEN_BUDGET
    assert log_prob_micro_batching(arr.rollout, engine, sized_budget=65536).max_tokens == 65536
    assert reference_engine_config(engine, arr.ref).max_tokens_per_rank == FALLBACK_TOKEN_BUDGET


class FakeActorRollout:
    """The driver's handle on the actor-rollout group: what size_token_budgets was asked, per-rank answers."""

    def __init__(self, answer: dict[str, int] | None = None):
        self.answer, self.calls = answer, []

    def size_token_budgets(self, passes, longest_sequence, timeout_s):
        if self.answer is None:
            raise AssertionError("the driver asked to size budgets where none should be sized")
        self.calls.append((passes, longest_sequence, timeout_s))
        return [dict(self.answer), dict(self.answer)]


def test_on_cpu_the_driver_records_the_configured_budgets_without_sizing():
    from verl_like.trainer.setup import size_token_budgets

    metrics = size_token_budgets(_config(DYNAMIC + [f"{A}.actor.ppo_max_token_len_per_gpu=3000"]), FakeActorRollout())
    assert metrics == {"actor/token_budget": 3000.0, "actor/log_prob_token_budget": 16384.0,
                       "ref/token_budget": 16384.0}
    assert size_token_budgets(_config([]), FakeActorRollout()) == {}  # nothing micro-batches by tokens


def test_on_cuda_the_driver_sizes_the_null_budgets_once_and_keeps_the_set_ones():
    from verl_like.trainer.setup import size_token_budgets

    config = _config(GPU + DYNAMIC + [f"{A}.rollout.log_prob_max_token_len_per_gpu=5000"])
    group = FakeActorRollout({"update": 65536, "ref_log_prob": 131072})
    metrics = size_token_budgets(config, group)
    assert group.calls == [(["update", "ref_log_prob"], longest_sequence(config),
                            config.trainer.timeouts.worker_start_timeout_s)]
    assert metrics == {"actor/token_budget": 65536.0, "actor/log_prob_token_budget": 5000.0,
                       "ref/token_budget": 131072.0}


def test_a_lora_reference_has_no_budget_of_its_own():
    config = _config(GPU + DYNAMIC + [f"{A}.model.lora_rank=4"])
    assert auto_budget_passes(config) == ("update", "log_prob")
