"""Advantage estimators against the loop references; edge cases; registry coverage."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import algo_reference as ref
from verl_like.algorithms import ADVANTAGE_ESTIMATORS, AdvantageConfig, AdvantageInputs, compute_advantage

BATCH, LENGTH = 12, 9


def _adv(name: str, config: AdvantageConfig, **fields) -> tuple[torch.Tensor, torch.Tensor]:
    return compute_advantage(name, AdvantageInputs(**fields), config)


def _inputs(seed: int, device: str = "cpu", length: int = LENGTH, batch: int = BATCH):
    gen = torch.Generator().manual_seed(seed)
    mask = ref.random_mask(batch, length, gen)
    rewards = torch.randn(batch, length, generator=gen, dtype=torch.float64)
    values = torch.randn(batch, length, generator=gen, dtype=torch.float64)
    # groups of sizes 4, 3, 2, 1, 1, 1 (shuffled), including a singleton and the empty row
    uids = np.array(["a"] * 4 + ["b"] * 3 + ["c"] * 2 + ["d", "e", "f"], dtype=object)
    index = uids[torch.randperm(batch, generator=gen).numpy()]
    baselines = torch.randn(batch, generator=gen, dtype=torch.float64)
    return rewards.to(device), values.to(device), mask.to(device), index, baselines.to(device)


def _reference(name: str, rewards, values, mask, index, baselines, config: AdvantageConfig):
    r, v, m = rewards.tolist(), values.tolist(), mask.tolist()
    if name == "gae":
        return ref.gae(r, v, m, config.gamma, config.lam)
    if name == "grpo":
        adv = ref.grpo(r, m, list(index), config.norm_adv_by_std_in_grpo, config.epsilon)
        return adv, adv
    if name == "rloo":
        adv = ref.rloo(r, m, list(index))
        return adv, adv
    if name == "reinforce_plus_plus":
        returns = ref.discounted_returns(r, m, config.gamma)
        return ref.whiten(returns, m), returns
    if name == "reinforce_plus_plus_baseline":
        adv = ref.reinforce_pp_baseline(r, m, list(index))
        return adv, adv
    if name == "remax":
        return ref.remax(r, m, baselines.tolist())
    raise AssertionError(f"no reference for registered estimator {name!r}: add one")


CONFIGS = [
    AdvantageConfig(gamma=1.0, lam=1.0),
    AdvantageConfig(gamma=0.9, lam=0.8, norm_adv_by_std_in_grpo=False, epsilon=1e-4),
]


@pytest.mark.parametrize("device", ref.devices())
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("name", ADVANTAGE_ESTIMATORS.names())
def test_estimator_matches_loop_reference(name: str, config: AdvantageConfig, device: str) -> None:
    for seed in range(3):
        rewards, values, mask, index, baselines = _inputs(seed, device)
        adv, ret = _adv(
            name, token_level_rewards=rewards, response_mask=mask, config=config, index=index, values=values,
            reward_baselines=baselines,
        )
        exp_adv, exp_ret = _reference(name, rewards, values, mask, index, baselines, config)
        assert adv.dtype == torch.float64 and adv.shape == (BATCH, LENGTH)
        ref.assert_close(adv.cpu(), torch.tensor(exp_adv, dtype=torch.float64), rtol=1e-9, atol=1e-9)
        ref.assert_close(ret.cpu(), torch.tensor(exp_ret, dtype=torch.float64), rtol=1e-9, atol=1e-9)
        assert not bool(adv[~mask].any()) and not bool(ret[~mask].any()), "padding must be zero"


@pytest.mark.parametrize("name", ADVANTAGE_ESTIMATORS.names())
def test_low_precision_inputs_give_finite_float32(name: str) -> None:
    rewards, values, mask, index, baselines = _inputs(7)
    adv, ret = _adv(
        name, token_level_rewards=rewards.to(torch.bfloat16), response_mask=mask.float(), config=AdvantageConfig(),
        index=torch.as_tensor(np.unique(index, return_inverse=True)[1]), values=values.half(),
        reward_baselines=baselines.half(),
    )
    assert adv.dtype == torch.float32 and ret.dtype == torch.float32
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()


@pytest.mark.parametrize("name", ["grpo", "rloo", "reinforce_plus_plus_baseline"])
@pytest.mark.parametrize("norm", [True, False])
def test_group_estimators_give_zero_when_rewards_equal_or_group_of_one(name: str, norm: bool) -> None:
    mask = torch.ones(5, 4, dtype=torch.bool)
    rewards = torch.zeros(5, 4)
    rewards[:, -1] = torch.tensor([1.0, 1.0, 1.0, 0.3, 2.0])  # group 0 all equal; groups 1 and 2 are singletons
    adv, _ = _adv(
        name, token_level_rewards=rewards, response_mask=mask,
        config=AdvantageConfig(norm_adv_by_std_in_grpo=norm), index=torch.tensor([7, 7, 7, 3, 5]),
    )
    assert torch.isfinite(adv).all()
    assert torch.equal(adv, torch.zeros_like(adv))


def test_grpo_std_normalisation_and_dr_grpo_differ_by_the_std() -> None:
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 3.0]])
    mask = torch.ones(3, 2)
    index = ["p", "p", "p"]
    grpo, _ = _adv("grpo", AdvantageConfig(), token_level_rewards=rewards, response_mask=mask, index=index)
    dr, _ = _adv(
        "grpo", token_level_rewards=rewards, response_mask=mask,
        config=AdvantageConfig(norm_adv_by_std_in_grpo=False), index=index,
    )
    ref.assert_close(dr[:, 0], torch.tensor([-1 / 3, -4 / 3, 5 / 3]), rtol=1e-6, atol=1e-6)
    ref.assert_close(grpo * (torch.tensor([1.0, 0.0, 3.0]).std() + 1e-6), dr, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ADVANTAGE_ESTIMATORS.names())
def test_fully_masked_batch_gives_zeros_not_nan(name: str) -> None:
    mask = torch.zeros(4, 6, dtype=torch.bool)
    adv, ret = _adv(
        name, token_level_rewards=torch.randn(4, 6), response_mask=mask, config=AdvantageConfig(gamma=0.99, lam=0.95),
        index=[0, 0, 1, 1], values=torch.randn(4, 6), reward_baselines=torch.randn(4),
    )
    assert torch.equal(adv, torch.zeros_like(adv)) and torch.equal(ret, torch.zeros_like(ret))


@pytest.mark.parametrize("name", ["gae", "reinforce_plus_plus"])
def test_long_sequences_match_reference(name: str) -> None:
    rewards, values, mask, index, baselines = _inputs(3, length=2048, batch=3)
    config = AdvantageConfig(gamma=0.999, lam=0.97)
    adv, ret = _adv(name, token_level_rewards=rewards, response_mask=mask, config=config, values=values)
    exp_adv, exp_ret = _reference(name, rewards, values, mask, index, baselines, config)
    ref.assert_close(adv, torch.tensor(exp_adv, dtype=torch.float64), rtol=1e-8, atol=1e-8)
    ref.assert_close(ret, torch.tensor(exp_ret, dtype=torch.float64), rtol=1e-8, atol=1e-8)


def test_gae_skips_masked_tokens_in_the_middle() -> None:
    # A hole (an observation/tool-output span) must not be a time step: the value after token 0 is token 3's.
    rewards = torch.tensor([[0.0, 5.0, 5.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 9.0, 9.0, 0.25]], dtype=torch.float64)
    mask = torch.tensor([[1, 0, 0, 1]])
    _, returns = _adv(
        "gae", AdvantageConfig(gamma=0.5, lam=1.0), token_level_rewards=rewards, response_mask=mask, values=values
    )
    ref.assert_close(returns, torch.tensor([[0.5, 0.0, 0.0, 1.0]], dtype=torch.float64))


@pytest.mark.parametrize(
    ("name", "missing"), [("gae", "values"), ("grpo", "index"), ("rloo", "index"), ("remax", "reward_baselines"),
                          ("reinforce_plus_plus_baseline", "index")]
)
def test_missing_input_names_the_argument(name: str, missing: str) -> None:
    with pytest.raises(ValueError, match=missing):
        _adv(name, token_level_rewards=torch.zeros(2, 3), response_mask=torch.ones(2, 3), config=AdvantageConfig())


def test_bad_shapes_and_config_are_rejected() -> None:
    with pytest.raises(ValueError, match="index has 3 entries"):
        _adv("grpo", token_level_rewards=torch.zeros(2, 3), response_mask=torch.ones(2, 3),
                          config=AdvantageConfig(), index=[0, 0, 1])
    with pytest.raises(ValueError, match="one shape"):
        _adv("rloo", token_level_rewards=torch.zeros(2, 3), response_mask=torch.ones(2, 4),
                          config=AdvantageConfig(), index=[0, 0])
    with pytest.raises(ValueError, match=r"reward_baselines must be \(batch,\)"):
        _adv("remax", token_level_rewards=torch.zeros(2, 3), response_mask=torch.ones(2, 3),
                          config=AdvantageConfig(), reward_baselines=torch.zeros(2, 3))
    with pytest.raises(ValueError, match="algorithm.gamma"):
        AdvantageConfig(gamma=1.5)
    with pytest.raises(ValueError, match="algorithm.lam"):
        AdvantageConfig(lam=-0.1)
    with pytest.raises(ValueError, match="epsilon"):
        AdvantageConfig(epsilon=0.0)
