"""Policy losses and rollout IS weights against loop references; gradients; micro-batch/DP equivalence."""

from __future__ import annotations

import math

import pytest
import torch

import algo_reference as ref
from algo_sharding import accumulated_grad, shard_plan
from verl_like.algorithms import (
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    LossNormalizer,
    PolicyLossConfig,
    PolicyLossInputs,
    RolloutISConfig,
    compute_policy_loss,
    compute_rollout_is_weights,
)

BATCH, LENGTH = 10, 8
CONFIGS = [
    PolicyLossConfig(),
    PolicyLossConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=None),  # DAPO clip-higher, no dual
    PolicyLossConfig(clip_ratio_low=0.1, clip_ratio_high=0.3, clip_ratio_c=1.5),
]


def _data(seed: int, device: str = "cpu", spread: float = 0.4):
    gen = torch.Generator().manual_seed(seed)
    mask = ref.random_mask(BATCH, LENGTH, gen, empty_rows=1)
    old = -torch.rand(BATCH, LENGTH, generator=gen, dtype=torch.float64) * 3
    new = old + spread * torch.randn(BATCH, LENGTH, generator=gen, dtype=torch.float64)
    adv = torch.randn(BATCH, LENGTH, generator=gen, dtype=torch.float64)
    rollout = old + 0.3 * torch.randn(BATCH, LENGTH, generator=gen, dtype=torch.float64)
    return [t.to(device) for t in (old, new, adv, mask, rollout)] + [gen]


def _reference_tokens(name, new, old, adv, mask, config):
    lp, o, a, m = new.tolist(), old.tolist(), adv.tolist(), mask.tolist()
    if name == "vanilla":
        return [[ref.ppo_clip_token(lp[i][t], o[i][t], a[i][t], config.clip_ratio_low, config.clip_ratio_high,
                                    config.clip_ratio_c) if m[i][t] else 0.0 for t in range(len(m[i]))]
                for i in range(len(m))]
    if name == "gspo":
        return [ref.gspo_tokens(lp[i], o[i], a[i], m[i], config.clip_ratio_low, config.clip_ratio_high)
                for i in range(len(m))]
    if name == "gpg":
        return [[-a[i][t] * lp[i][t] if m[i][t] else 0.0 for t in range(len(m[i]))] for i in range(len(m))]
    raise AssertionError(f"no reference for registered policy loss {name!r}: add one")


def _run(name, old, new, adv, mask, normalizer, config, weights=None):
    inputs = PolicyLossInputs(old_log_probs=old, log_probs=new, advantages=adv, response_mask=mask,
                              rollout_is_weights=weights)
    return compute_policy_loss(name, inputs, normalizer=normalizer, config=config)


@pytest.mark.parametrize("device", ref.devices())
@pytest.mark.parametrize("with_is", [False, True])
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_policy_loss_matches_loop_reference(name: str, mode: str, with_is: bool, device: str) -> None:
    for seed, config in enumerate(CONFIGS):
        old, new, adv, mask, rollout, gen = _data(seed, device, spread=0.6)
        weights = torch.rand(BATCH, LENGTH, generator=gen, dtype=torch.float64).to(device) * 2 if with_is else None
        normalizer = LossNormalizer.for_mini_batch(mask, mode, dp_group=None)
        loss, metrics = _run(name, old, new, adv, mask, normalizer, config, weights)
        tokens = _reference_tokens(name, new, old, adv, mask, config)
        if with_is:
            tokens = [[tokens[i][t] * weights[i, t].item() for t in range(LENGTH)] for i in range(BATCH)]
        expected = ref.aggregate(tokens, mask.tolist(), mode, LENGTH)
        assert loss.item() == pytest.approx(expected, rel=1e-10, abs=1e-12)
        assert metrics["pg_loss"].item() == pytest.approx(expected, rel=1e-10, abs=1e-12)
        assert ("is_weight_mean" in metrics) == with_is


@pytest.mark.parametrize("config", CONFIGS)
def test_ppo_clip_gradient_matches_reference(config: PolicyLossConfig) -> None:
    old, new, adv, mask, _, _ = _data(3, spread=0.8)
    new.requires_grad_(True)
    normalizer = LossNormalizer.for_mini_batch(mask, "token-mean", dp_group=None)
    loss, _ = _run("vanilla", old, new, adv, mask, normalizer, config)
    (grad,) = torch.autograd.grad(loss, new)
    n_tokens = int(mask.sum())
    expected = [[ref.ppo_clip_token_grad(new[i, t].item(), old[i, t].item(), adv[i, t].item(), config.clip_ratio_low,
                                         config.clip_ratio_high, config.clip_ratio_c) / n_tokens if mask[i, t] else 0.0
                 for t in range(LENGTH)] for i in range(BATCH)]
    ref.assert_close(grad, torch.tensor(expected, dtype=torch.float64), rtol=1e-10, atol=1e-12)


def test_gspo_token_form_has_the_sequence_objective_gradient() -> None:
    # GSPO's objective, written per sequence: mean_i max(-A_i s_i, -A_i clip(s_i)), s_i = exp(mean_t log-ratio).
    old, new, adv_tok, mask, _, gen = _data(4, spread=0.05)
    seq_adv = torch.randn(BATCH, generator=gen, dtype=torch.float64)
    adv = seq_adv.unsqueeze(-1).expand(BATCH, LENGTH).clone()
    config = PolicyLossConfig(clip_ratio_low=0.02, clip_ratio_high=0.03)
    new.requires_grad_(True)
    loss, _ = _run("gspo", old, new, adv, mask, LossNormalizer.for_mini_batch(mask, "seq-mean-token-mean",
                                                                           dp_group=None), config)
    (grad,) = torch.autograd.grad(loss, new)
    theta = new.detach().clone().requires_grad_(True)
    per_seq = []
    for i in range(BATCH):
        pos = [t for t in range(LENGTH) if mask[i, t]]
        if not pos:
            continue
        s = torch.exp(sum(theta[i, t] - old[i, t] for t in pos) / len(pos))
        a = seq_adv[i]
        per_seq.append(torch.maximum(-a * s, -a * s.clamp(1 - 0.02, 1 + 0.03)))
    (expected,) = torch.autograd.grad(sum(per_seq) / len(per_seq), theta)
    ref.assert_close(grad, expected, rtol=1e-10, atol=1e-12)
    assert bool((grad != 0).any()) and bool((grad == 0)[mask.bool()].any()), "want both clipped and unclipped rows"


@pytest.mark.parametrize("grad_reduction", ["mean", "sum"])
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_micro_batches_and_dp_shards_give_the_full_batch_gradient(name: str, mode: str, grad_reduction: str) -> None:
    old, new, adv, mask, rollout, gen = _data(5, spread=0.3)
    weights, _ = compute_rollout_is_weights(old, rollout, mask, RolloutISConfig())
    theta = new.clone().requires_grad_(True)
    config = PolicyLossConfig(clip_ratio_high=0.28)

    def loss_with(normalizer):
        return lambda rows, n: _run(name, old[rows, :n], theta[rows, :n], adv[rows, :n], mask[rows, :n],
                                    normalizer, config, weights[rows, :n]).loss

    full = accumulated_grad(theta, [torch.arange(BATCH)], mask, loss_with(LossNormalizer.for_mini_batch(
        mask, mode, dp_group=None)))
    assert bool(full.abs().sum() > 0)
    plan = shard_plan(BATCH, 2, gen)
    norm = LossNormalizer.from_shard_masks([mask[torch.cat(m)] for m in plan], mode, grad_reduction=grad_reduction)
    grads = [accumulated_grad(theta, micro, mask, loss_with(norm)) for micro in plan]
    combined = sum(grads) / (len(grads) if grad_reduction == "mean" else 1)
    ref.assert_close(combined, full, rtol=1e-11, atol=1e-14)


def test_ppo_clip_metrics_count_the_clipped_tokens() -> None:
    old = torch.zeros(1, 6)
    new = torch.log(torch.tensor([[1.5, 0.5, 1.5, 0.5, 5.0, 1.0]]))
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0, -1.0, 1.0]])
    mask = torch.ones(1, 6, dtype=torch.bool)
    norm = LossNormalizer.for_mini_batch(mask, "token-mean", dp_group=None)
    _, m = _run("vanilla", old, new, adv, mask, norm, PolicyLossConfig(clip_ratio_c=3.0))
    # token 0: A>0, r>1.2 -> ratio_high; token 1: A<0, r<0.8 -> ratio_low; token 4: A<0, r=5>3 -> dual clip,
    # which verl reports as pg_clipfrac_lower (verl/trainer/ppo/core_algos.py compute_policy_loss)
    assert m["pg_clipfrac_ratio_high"].item() == pytest.approx(1 / 6)
    assert m["pg_clipfrac_ratio_low"].item() == pytest.approx(1 / 6)
    assert m["pg_clipfrac"].item() == pytest.approx(2 / 6)
    assert m["pg_clipfrac_lower"].item() == pytest.approx(1 / 6)
    assert m["approx_kl"].item() == pytest.approx(-float(new.mean()), rel=1e-6)
    no_dual, _ = _run("vanilla", old, new, adv, mask, norm, PolicyLossConfig(clip_ratio_c=None))
    dual, _ = _run("vanilla", old, new, adv, mask, norm, PolicyLossConfig(clip_ratio_c=3.0))
    assert no_dual.item() - dual.item() == pytest.approx((5.0 - 3.0) / 6, rel=1e-6)


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_extreme_log_ratios_and_inf_padding_stay_finite(name: str) -> None:
    old, new, adv, mask, _, _ = _data(6)
    new = (old + torch.where(torch.rand_like(old) < 0.5, 1e3, -1e3)).float()
    new = torch.where(mask, new, float("-inf")).requires_grad_(True)
    old = torch.where(mask, old.float(), float("-inf"))
    for mode in LOSS_AGG_MODES:
        norm = LossNormalizer.for_mini_batch(mask, mode, dp_group=None)
        loss, metrics = _run(name, old, new, adv.float(), mask, norm, PolicyLossConfig(clip_ratio_c=None))
        (grad,) = torch.autograd.grad(loss, new)
        assert torch.isfinite(loss) and torch.isfinite(grad).all()
        assert all(torch.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_bfloat16_inputs_compute_in_float32(name: str) -> None:
    old, new, adv, mask, _, _ = _data(7)
    new_bf16 = new.to(torch.bfloat16).requires_grad_(True)
    norm = LossNormalizer.for_mini_batch(mask.float(), "token-mean", dp_group=None)
    bf16 = torch.bfloat16
    loss, _ = _run(name, old.to(bf16), new_bf16, adv.to(bf16), mask.float(), norm, PolicyLossConfig())
    loss.backward()
    assert loss.dtype == torch.float32 and new_bf16.grad.dtype == torch.bfloat16
    assert torch.isfinite(new_bf16.grad.float()).all()


def test_policy_loss_config_and_inputs_are_validated() -> None:
    with pytest.raises(ValueError, match="actor.clip_ratio_low"):
        PolicyLossConfig(clip_ratio_low=1.0)
    with pytest.raises(ValueError, match="actor.clip_ratio_high"):
        PolicyLossConfig(clip_ratio_high=-0.1)
    with pytest.raises(ValueError, match="actor.clip_ratio_c"):
        PolicyLossConfig(clip_ratio_c=1.0)
    with pytest.raises(ValueError, match="one shape"):
        PolicyLossInputs(old_log_probs=torch.zeros(2, 3), log_probs=torch.zeros(2, 3), advantages=torch.zeros(2, 4),
                         response_mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match="actor.policy_loss.loss_mode='ppo'.*gspo"):
        compute_policy_loss("ppo", None, normalizer=None, config=PolicyLossConfig())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="normalizer"):
        compute_policy_loss("vanilla", None, config=PolicyLossConfig())  # type: ignore[call-arg]


# ---- rollout importance sampling ----

IS_CONFIGS = [
    RolloutISConfig(level=level, mode=mode, threshold=threshold, threshold_lower=lower)
    for level in ("token", "sequence", "geometric")
    for mode, threshold, lower in (("truncate", 2.0, None), ("truncate", 1.2, None), ("mask", 2.0, None),
                                   ("mask", 1.5, 0.9))
]


@pytest.mark.parametrize("device", ref.devices())
@pytest.mark.parametrize("config", IS_CONFIGS, ids=lambda c: f"{c.level}-{c.mode}-{c.threshold}-{c.threshold_lower}")
def test_rollout_is_weights_match_reference(config: RolloutISConfig, device: str) -> None:
    for seed in range(3):
        old, _, _, mask, rollout, _ = _data(seed, device)
        rollout = old + 0.1 * (rollout - old)  # keep sequence products near 1 so every branch is hit
        weights, metrics = compute_rollout_is_weights(old, rollout, mask, config)
        expected = ref.is_weights(old.tolist(), rollout.tolist(), mask.tolist(), config.level, config.mode,
                                  config.threshold, config.lower)
        ref.assert_close(weights, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-14)
        valid = [w for row, m in zip(expected, mask.tolist()) for w, v in zip(row, m) if v]
        assert metrics["rollout_is/mean"].item() == pytest.approx(sum(valid) / len(valid))
        assert metrics["rollout_is/max"].item() == pytest.approx(max(valid))
        assert metrics["rollout_is/min"].item() == pytest.approx(min(valid))
        assert not weights.requires_grad


def test_rollout_is_clipped_fraction_and_extremes() -> None:
    old = torch.zeros(2, 4)
    rollout = torch.tensor([[0.0, -1e4, 1e4, 0.0], [-2.0, 0.0, 0.0, 0.0]])  # ratios 1, e^1e4, e^-1e4, 1 | e^2,1,1,1
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    for config in IS_CONFIGS:
        weights, metrics = compute_rollout_is_weights(old, rollout, mask, config)
        assert torch.isfinite(weights).all() and all(torch.isfinite(v) for v in metrics.values())
        assert weights.max() <= config.threshold + 1e-6
    weights, metrics = compute_rollout_is_weights(old, rollout, mask, RolloutISConfig(level="token", mode="truncate"))
    assert weights[0].tolist() == pytest.approx([1.0, 2.0, 0.0, 0.0]) and weights[1, 0].item() == pytest.approx(2.0)
    assert metrics["rollout_is/clipped_frac"].item() == pytest.approx(2 / 7)
    weights, _ = compute_rollout_is_weights(old, rollout, mask, RolloutISConfig(level="token", mode="mask"))
    assert weights[0].tolist() == [1.0, 0.0, 0.0, 0.0]
    # mean over valid tokens of log pi_rollout - log pi_old
    assert metrics["rollout_is/mismatch_kl"].item() == pytest.approx((0.0 - 1e4 + 1e4 - 2.0) / 7, rel=1e-5)


def test_rollout_is_config_is_validated() -> None:
    with pytest.raises(ValueError, match="rollout_is_level"):
        RolloutISConfig(level="batch")
    with pytest.raises(ValueError, match="rollout_is_mode"):
        RolloutISConfig(mode="clip")
    with pytest.raises(ValueError, match="rollout_is_threshold=1.0"):
        RolloutISConfig(threshold=1.0)
    with pytest.raises(ValueError, match="only used with algorithm.rollout_is_mode='mask'"):
        RolloutISConfig(mode="truncate", threshold_lower=0.5)
    with pytest.raises(ValueError, match="rollout_is_threshold_lower"):
        RolloutISConfig(mode="mask", threshold_lower=1.5)
    assert RolloutISConfig(mode="mask", threshold=4.0).lower == pytest.approx(0.25)
    assert math.isclose(RolloutISConfig(mode="mask", threshold=4.0, threshold_lower=0.5).lower, 0.5)
