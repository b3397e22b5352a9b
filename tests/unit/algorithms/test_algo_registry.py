"""Registries: lookup errors name the config key and the valid names; users can register their own functions."""

from __future__ import annotations

import pytest
import torch

from verl_like.algorithms import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    AdvantageConfig,
    AdvantageInputs,
    LossNormalizer,
    LossOutput,
    PolicyLossConfig,
    PolicyLossInputs,
    compute_advantage,
    compute_policy_loss,
    get_advantage_estimator,
    get_kl_estimator,
    get_policy_loss,
    kl_estimate,
    register_advantage_estimator,
    register_kl_estimator,
    register_policy_loss,
)
from verl_like.algorithms.registry import Registry


@pytest.fixture
def scratch_registries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let a test register names without leaking them into the other tests."""
    for registry in (ADVANTAGE_ESTIMATORS, POLICY_LOSSES, KL_ESTIMATORS):
        monkeypatch.setattr(registry, "_entries", dict(registry._entries))
        monkeypatch.setattr(registry.accepted, "_names", set(registry.accepted._names))  # the config's names


def test_builtin_names() -> None:
    assert ADVANTAGE_ESTIMATORS.names() == sorted(
        ["gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax"])
    assert POLICY_LOSSES.names() == ["gpg", "gspo", "vanilla"]
    assert set(KL_ESTIMATORS.names()) == {"k1", "kl", "k2", "mse", "k3", "low_var_kl", "abs", "k1+", "k3+"}


@pytest.mark.parametrize(
    ("getter", "key", "valid"),
    [(get_advantage_estimator, "algorithm.adv_estimator", "grpo"), (get_policy_loss, "actor.policy_loss.loss_mode",
                                                                     "vanilla"),
     (get_kl_estimator, "algorithm.kl_penalty", "low_var_kl")],
)
def test_unknown_name_names_key_and_valid_choices(getter, key: str, valid: str) -> None:
    with pytest.raises(ValueError, match=rf"{key}.*'nope'.*valid names:.*{valid}"):
        getter("nope")
    with pytest.raises(ValueError, match="valid names"):
        getter(None)


def test_duplicate_and_empty_names_are_refused() -> None:
    registry = Registry("thing", "x.thing")
    registry.register("a", "alias")(len)
    assert registry.get("alias") is len and "a" in registry and registry.names() == ["a", "alias"]
    with pytest.raises(ValueError, match="'a' is already registered"):
        registry.register("a")(abs)
    with pytest.raises(ValueError, match="non-empty"):
        registry.register("")(abs)
    assert registry.names() == ["a", "alias"], "a refused registration must not half-register"


@pytest.mark.usefixtures("scratch_registries")
def test_user_registered_functions_are_used_by_name() -> None:
    @register_advantage_estimator("constant_one")
    def constant_one(inputs: AdvantageInputs, config: AdvantageConfig):
        ones = inputs.response_mask.float()
        return ones, ones

    @register_policy_loss("zero_loss")
    def zero_loss(inputs: PolicyLossInputs, *, normalizer: LossNormalizer, config: PolicyLossConfig) -> LossOutput:
        return LossOutput(inputs.log_probs.sum() * 0, {})

    @register_kl_estimator("squared_twice")
    def squared_twice(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
        return (log_probs - ref_log_probs) ** 2

    mask = torch.ones(2, 3)
    adv, _ = compute_advantage("constant_one", AdvantageInputs(torch.zeros(2, 3), mask), AdvantageConfig())
    assert adv.sum().item() == 6
    inputs = PolicyLossInputs(torch.zeros(2, 3), torch.ones(2, 3), adv, mask)
    out = compute_policy_loss("zero_loss", inputs, normalizer=LossNormalizer.for_mini_batch(mask, "token-mean",
                                                                                            dp_group=None),
                              config=PolicyLossConfig())
    assert out.loss.item() == 0
    assert kl_estimate(torch.ones(1, 2), torch.zeros(1, 2), "squared_twice").tolist() == [[1.0, 1.0]]
