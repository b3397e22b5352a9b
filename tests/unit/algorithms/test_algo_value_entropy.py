"""Value loss and entropy against loop references; gradient equivalence; numerical extremes."""

from __future__ import annotations

import pytest
import torch

import algo_reference as ref
from algo_sharding import accumulated_grad, shard_plan
from verl_like.algorithms import (
    LOSS_AGG_MODES,
    LossNormalizer,
    compute_value_loss,
    entropy_from_logits,
    entropy_from_logits_chunked,
)

BATCH, LENGTH = 9, 7


def _values(seed: int, device: str = "cpu"):
    gen = torch.Generator().manual_seed(seed)
    mask = ref.random_mask(BATCH, LENGTH, gen)
    values = torch.randn(BATCH, LENGTH, generator=gen, dtype=torch.float64)
    vpreds = values + 0.4 * torch.randn(BATCH, LENGTH, generator=gen, dtype=torch.float64)
    returns = torch.randn(BATCH, LENGTH, generator=gen, dtype=torch.float64)
    return [t.to(device) for t in (vpreds, values, returns, mask)] + [gen]


@pytest.mark.parametrize("device", ref.devices())
@pytest.mark.parametrize("clip", [None, 0.2])
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_value_loss_matches_reference(mode: str, clip: float | None, device: str) -> None:
    for seed in range(3):
        vpreds, values, returns, mask, _ = _values(seed, device)
        loss, metrics = compute_value_loss(vpreds, values, returns, mask,
                                           normalizer=LossNormalizer.for_mini_batch(mask, mode, dp_group=None),
                                           cliprange_value=clip)
        m = mask.tolist()
        tokens = [[ref.value_loss_token(vpreds[i, t].item(), values[i, t].item(), returns[i, t].item(), clip)
                   if m[i][t] else 0.0 for t in range(LENGTH)] for i in range(BATCH)]
        expected = ref.aggregate(tokens, m, mode, LENGTH)
        assert loss.item() == pytest.approx(expected, rel=1e-10)
        assert metrics["vf_loss"].item() == pytest.approx(expected, rel=1e-10)
        clipped = 0
        for i in range(BATCH):
            for t in range(LENGTH):
                if not m[i][t] or clip is None:
                    continue
                vp, v, r = vpreds[i, t].item(), values[i, t].item(), returns[i, t].item()
                clipped += (v + max(-clip, min(clip, vp - v)) - r) ** 2 > (vp - r) ** 2
        assert metrics["vf_clipfrac"].item() == pytest.approx(clipped / int(mask.sum()))


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_value_loss_micro_batches_and_dp_shards_give_full_gradient(mode: str) -> None:
    vpreds, values, returns, mask, gen = _values(11)
    theta = vpreds.clone().requires_grad_(True)

    def loss_with(norm):
        return lambda r, n: compute_value_loss(theta[r, :n], values[r, :n], returns[r, :n], mask[r, :n],
                                               normalizer=norm, cliprange_value=0.2).loss

    full = accumulated_grad(theta, [torch.arange(BATCH)], mask, loss_with(
        LossNormalizer.for_mini_batch(mask, mode, dp_group=None)))
    plan = shard_plan(BATCH, 2, gen)
    norm = LossNormalizer.from_shard_masks([mask[torch.cat(m)] for m in plan], mode, grad_reduction="mean")
    combined = sum(accumulated_grad(theta, micro, mask, loss_with(norm)) for micro in plan) / 2
    ref.assert_close(combined, full, rtol=1e-11, atol=1e-14)


def test_value_loss_rejects_bad_cliprange() -> None:
    vpreds, values, returns, mask, _ = _values(0)
    with pytest.raises(ValueError, match="critic.cliprange_value"):
        compute_value_loss(vpreds, values, returns, mask,
                           normalizer=LossNormalizer.for_mini_batch(mask, "token-mean", dp_group=None),
                           cliprange_value=0.0)


def _logits(seed: int, vocab: int = 7) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(4, 5, vocab, generator=gen, dtype=torch.float64) * 3
    logits[0, 0] = torch.tensor([1e4, -1e4, 0.0, 5e3, 1e4 - 1.0, -3.0, 2.0], dtype=torch.float64)[:vocab]
    logits[1, 1, :3] = float("-inf")  # masked vocabulary entries
    return logits


@pytest.mark.parametrize("device", ref.devices())
def test_entropy_matches_reference_incl_extreme_and_masked_logits(device: str) -> None:
    logits = _logits(0).to(device)
    got = entropy_from_logits(logits)
    expected = torch.tensor([[ref.entropy(row) for row in batch] for batch in logits.tolist()], dtype=torch.float64)
    ref.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    ref.assert_close(entropy_from_logits_chunked(logits, chunk_size=3), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk_size", [1, 3, 1000])
def test_chunked_entropy_equals_plain_in_value_and_gradient(chunk_size: int) -> None:
    logits = _logits(1).requires_grad_(True)
    plain = entropy_from_logits(logits)
    (g_plain,) = torch.autograd.grad((plain * torch.arange(5.0, dtype=torch.float64)).sum(), logits)
    chunked = entropy_from_logits_chunked(logits, chunk_size=chunk_size)
    (g_chunked,) = torch.autograd.grad((chunked * torch.arange(5.0, dtype=torch.float64)).sum(), logits)
    ref.assert_close(chunked, plain.detach(), rtol=1e-12, atol=1e-12)
    ref.assert_close(g_chunked, g_plain, rtol=1e-12, atol=1e-12)
    assert torch.isfinite(g_plain).all(), "masked (-inf) logits must not make the gradient NaN"
    with torch.no_grad():
        ref.assert_close(entropy_from_logits_chunked(logits, chunk_size=chunk_size), plain.detach(), rtol=1e-12,
                         atol=1e-12)


def test_entropy_low_precision_and_edge_shapes() -> None:
    logits = _logits(2).to(torch.bfloat16)
    got = entropy_from_logits(logits)
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    ref.assert_close(got, entropy_from_logits(logits.double()).float(), rtol=1e-5, atol=1e-5)
    uniform = torch.zeros(3, 50, dtype=torch.float16)
    expected = torch.full((3,), torch.log(torch.tensor(50.0)).item())
    ref.assert_close(entropy_from_logits_chunked(uniform, chunk_size=2), expected, rtol=1e-6, atol=1e-6)
    assert entropy_from_logits_chunked(torch.zeros(0, 4, 11)).shape == (0, 4)
    bf16 = _logits(3).to(torch.bfloat16).requires_grad_(True)
    entropy_from_logits_chunked(bf16, chunk_size=4).sum().backward()
    assert bf16.grad.dtype == torch.bfloat16 and torch.isfinite(bf16.grad.float()).all()
    with pytest.raises(ValueError, match="chunk_size"):
        entropy_from_logits_chunked(uniform, chunk_size=0)
