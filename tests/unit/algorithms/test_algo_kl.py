"""KL estimators, the KL loss, KL controllers and the KL reward penalty against loop references."""

from __future__ import annotations

import pytest
import torch

import algo_reference as ref
from algo_sharding import accumulated_grad, shard_plan
from verl_like.algorithms import (
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    AdaptiveKLController,
    FixedKLController,
    LossNormalizer,
    apply_kl_penalty,
    build_kl_controller,
    compute_kl_loss,
    kl_estimate,
)

BATCH, LENGTH = 8, 6


def _data(seed: int, device: str = "cpu", spread: float = 1.0):
    gen = torch.Generator().manual_seed(seed)
    mask = ref.random_mask(BATCH, LENGTH, gen)
    ref_lp = -torch.rand(BATCH, LENGTH, generator=gen, dtype=torch.float64) * 4
    lp = ref_lp + spread * torch.randn(BATCH, LENGTH, generator=gen, dtype=torch.float64)
    lp[0, :3] = ref_lp[0, :3] + torch.tensor([-60.0, 60.0, 25.0], dtype=torch.float64)  # k3's clamps
    return lp.to(device), ref_lp.to(device), mask.to(device), gen


@pytest.mark.parametrize("device", ref.devices())
@pytest.mark.parametrize("name", KL_ESTIMATORS.names())
def test_estimator_values_match_reference(name: str, device: str) -> None:
    lp, ref_lp, _, _ = _data(0, device)
    got = kl_estimate(lp, ref_lp, name)
    expected = [[ref.kl_token(a, b, name) for a, b in zip(r1, r2)] for r1, r2 in zip(lp.tolist(), ref_lp.tolist())]
    ref.assert_close(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    assert torch.isfinite(kl_estimate(lp.float(), ref_lp.float(), name)).all()


@pytest.mark.parametrize("name", ["k1+", "k3+"])
def test_straight_through_estimators_carry_k2_gradient(name: str) -> None:
    lp, ref_lp, _, _ = _data(1, spread=0.5)
    lp = lp[1:].clone().requires_grad_(True)  # row 0 holds the clamp probes, where k3's value is capped
    ref_lp = ref_lp[1:]
    (grad,) = torch.autograd.grad(kl_estimate(lp, ref_lp, name).sum(), lp)
    (grad_k2,) = torch.autograd.grad(kl_estimate(lp, ref_lp, "k2").sum(), lp)
    ref.assert_close(grad, grad_k2, rtol=1e-12, atol=1e-12)
    ref.assert_close(grad, (lp - ref_lp).detach(), rtol=1e-12, atol=1e-12)  # d/dlp of (lp - ref)^2 / 2
    base = "k1" if name == "k1+" else "k3"
    ref.assert_close(kl_estimate(lp, ref_lp, name).detach(), kl_estimate(lp, ref_lp, base).detach())


def test_k3_gradient_is_zero_beyond_its_cap_and_finite() -> None:
    lp = torch.tensor([[-60.0, 0.1]], dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(kl_estimate(lp, torch.zeros(1, 2, dtype=torch.float64), "k3").sum(), lp)
    assert grad[0, 0].item() == 0.0 and torch.isfinite(grad).all()
    assert grad[0, 1].item() == pytest.approx(1 - torch.exp(torch.tensor(-0.1)).item())


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("name", ["k1", "k2", "k3", "abs", "k3+"])
def test_kl_loss_matches_reference_and_ignores_inf_padding(name: str, mode: str) -> None:
    lp, ref_lp, mask, _ = _data(2)
    lp_pad = torch.where(mask, lp, float("-inf")).requires_grad_(True)
    ref_pad = torch.where(mask, ref_lp, float("-inf"))
    loss, metrics = compute_kl_loss(lp_pad, ref_pad, mask,
                                    normalizer=LossNormalizer.for_mini_batch(mask, mode, dp_group=None),
                                    kl_loss_type=name)
    m = mask.tolist()
    tokens = [[ref.kl_token(lp[i, t].item(), ref_lp[i, t].item(), name) if m[i][t] else 0.0 for t in range(LENGTH)]
              for i in range(BATCH)]
    assert loss.item() == pytest.approx(ref.aggregate(tokens, m, mode, LENGTH), rel=1e-10)
    assert metrics["kl_loss"].item() == pytest.approx(loss.item())
    (grad,) = torch.autograd.grad(loss, lp_pad)
    assert torch.isfinite(grad).all() and not bool(grad[~mask].any())


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_kl_loss_micro_batches_and_dp_shards_give_full_gradient(mode: str) -> None:
    lp, ref_lp, mask, gen = _data(3, spread=0.3)
    theta = lp.clone().requires_grad_(True)

    def loss_with(norm):
        return lambda r, n: compute_kl_loss(theta[r, :n], ref_lp[r, :n], mask[r, :n], normalizer=norm,
                                            kl_loss_type="low_var_kl").loss

    full = accumulated_grad(theta, [torch.arange(BATCH)], mask, loss_with(
        LossNormalizer.for_mini_batch(mask, mode, dp_group=None)))
    plan = shard_plan(BATCH, 2, gen)
    norm = LossNormalizer.from_shard_masks([mask[torch.cat(m)] for m in plan], mode, grad_reduction="sum")
    combined = sum(accumulated_grad(theta, micro, mask, loss_with(norm)) for micro in plan)
    ref.assert_close(combined, full, rtol=1e-11, atol=1e-14)


def test_controllers_follow_the_reference_update() -> None:
    fixed = build_kl_controller("fixed", kl_coef=0.05)
    fixed.update(current_kl=3.0, n_steps=64)
    assert isinstance(fixed, FixedKLController) and fixed.value == 0.05
    adaptive = build_kl_controller("adaptive", kl_coef=0.1, target_kl=0.02, horizon=1000)
    assert isinstance(adaptive, AdaptiveKLController)
    kls = [0.05, 0.001, 0.021, 0.0, 0.5, 0.019]
    for kl in kls:
        adaptive.update(kl, n_steps=32)
    assert adaptive.value == pytest.approx(ref.adaptive_kl(0.1, 0.02, 1000, kls, 32), rel=1e-12)
    assert adaptive.value != 0.1


def test_controller_config_is_validated() -> None:
    with pytest.raises(ValueError, match="algorithm.kl_ctrl.type='pid'"):
        build_kl_controller("pid", kl_coef=0.1)
    with pytest.raises(ValueError, match="target_kl and .horizon"):
        build_kl_controller("adaptive", kl_coef=0.1, target_kl=0.1)
    with pytest.raises(ValueError, match="kl_coef"):
        build_kl_controller("fixed", kl_coef=-1.0)
    with pytest.raises(ValueError, match="target_kl"):
        AdaptiveKLController(value=0.1, target_kl=0.0, horizon=10)
    with pytest.raises(ValueError, match="horizon"):
        AdaptiveKLController(value=0.1, target_kl=0.1, horizon=0)


@pytest.mark.parametrize("device", ref.devices())
@pytest.mark.parametrize("estimator", ["k1", "k3", "abs", "mse"])
@pytest.mark.parametrize("ctrl_type", ["fixed", "adaptive"])
def test_kl_penalty_in_reward_matches_reference(ctrl_type: str, estimator: str, device: str) -> None:
    lp, ref_lp, mask, gen = _data(4, device, spread=0.2)
    scores = torch.randn(BATCH, LENGTH, generator=gen, dtype=torch.float64).to(device)
    ctrl = build_kl_controller(ctrl_type, kl_coef=0.2, target_kl=0.01, horizon=500)
    rewards, metrics = apply_kl_penalty(scores, lp, ref_lp, mask, kl_ctrl=ctrl, kl_penalty=estimator)
    m = mask.tolist()
    kl = [[ref.kl_token(lp[i, t].item(), ref_lp[i, t].item(), estimator) if m[i][t] else 0.0 for t in range(LENGTH)]
          for i in range(BATCH)]
    expected = [[scores[i, t].item() - 0.2 * kl[i][t] for t in range(LENGTH)] for i in range(BATCH)]
    ref.assert_close(rewards, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    per_seq = [sum(kl[i]) / sum(m[i]) for i in range(BATCH) if any(m[i])]
    current = sum(per_seq) / len(per_seq)
    assert metrics["kl"] == pytest.approx(current, rel=1e-12) and metrics["kl_coef"] == 0.2
    expected_coef = 0.2 if ctrl_type == "fixed" else ref.adaptive_kl(0.2, 0.01, 500, [current], BATCH)
    assert ctrl.value == pytest.approx(expected_coef, rel=1e-12)


def test_unknown_estimator_lists_valid_names() -> None:
    with pytest.raises(ValueError, match=r"kl_loss_type.*'k4'.*low_var_kl"):
        kl_estimate(torch.zeros(1, 1), torch.zeros(1, 1), "k4")
