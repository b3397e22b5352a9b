"""Loss aggregation: loop reference, and micro-batch / DP-shard gradient equivalence for every mode."""

from __future__ import annotations

import os
import socket
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import algo_reference as ref
from algo_sharding import accumulated_grad, shard_plan
from verl_like.algorithms import LOSS_AGG_MODES, LossNormalizer, aggregate_loss
from verl_like.utils.device import get_dist_backend

BATCH, LENGTH = 14, 11


def _data(seed: int, device: str = "cpu"):
    gen = torch.Generator().manual_seed(seed)
    mask = ref.random_mask(BATCH, LENGTH, gen, empty_rows=2)
    loss = torch.randn(BATCH, LENGTH, generator=gen, dtype=torch.float64)
    return loss.to(device), mask.to(device), gen


@pytest.mark.parametrize("device", ref.devices())
@pytest.mark.parametrize("scale_factor", [None, 37.0])
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_full_batch_aggregation_matches_reference(mode: str, scale_factor: float | None, device: str) -> None:
    for seed in range(3):
        loss, mask, _ = _data(seed, device)
        normalizer = LossNormalizer.for_mini_batch(mask, mode, dp_group=None, loss_scale_factor=scale_factor)
        got = aggregate_loss(loss, mask, normalizer)
        expected = ref.aggregate(loss.tolist(), mask.tolist(), mode, scale_factor or LENGTH)
        assert got.item() == pytest.approx(expected, rel=1e-12, abs=1e-12)


def _per_token_loss(theta: torch.Tensor, rows: torch.Tensor, length: int) -> torch.Tensor:
    # a non-linear per-token loss so token weights matter
    x = theta[rows, :length]
    return torch.sin(x) * x + 0.5 * x**2


@pytest.mark.parametrize("grad_reduction", ["mean", "sum"])
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batches_and_dp_shards_give_the_full_batch_gradient(mode: str, grad_reduction: str) -> None:
    for seed in range(4):
        _, mask, gen = _data(seed)
        theta = torch.randn(BATCH, LENGTH, generator=gen, dtype=torch.float64, requires_grad=True)
        full_norm = LossNormalizer.for_mini_batch(mask, mode, dp_group=None)
        aggregate_loss(_per_token_loss(theta, torch.arange(BATCH), LENGTH), mask, full_norm).backward()
        full_grad = theta.grad.clone()
        theta.grad = None

        # one DP rank, gradient accumulation over re-padded micro-batches
        (micro,) = shard_plan(BATCH, 1, gen)
        grad = accumulated_grad(theta, micro, mask, lambda r, n: aggregate_loss(
            _per_token_loss(theta, r, n), mask[r, :n], full_norm))
        ref.assert_close(grad, full_grad, rtol=1e-12, atol=1e-14)

        # two simulated DP ranks, each accumulating its own micro-batches; the engine then sums or averages
        plan = shard_plan(BATCH, 2, gen)
        shard_masks = [mask[torch.cat(micro)] for micro in plan]
        norm = LossNormalizer.from_shard_masks(shard_masks, mode, grad_reduction=grad_reduction)
        def shard_loss(rows: torch.Tensor, length: int) -> torch.Tensor:
            return aggregate_loss(_per_token_loss(theta, rows, length), mask[rows, :length], norm)

        grads = [accumulated_grad(theta, micro, mask, shard_loss) for micro in plan]
        combined = sum(grads) / (len(grads) if grad_reduction == "mean" else 1)
        ref.assert_close(combined, full_grad, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batch_local_normaliser_would_give_a_different_gradient(mode: str) -> None:
    # The bug the global normaliser prevents: normalising each micro-batch by its own counts / own padded length.
    _, mask, gen = _data(0)
    theta = torch.randn(BATCH, LENGTH, generator=gen, dtype=torch.float64, requires_grad=True)
    aggregate_loss(_per_token_loss(theta, torch.arange(BATCH), LENGTH), mask,
                   LossNormalizer.for_mini_batch(mask, mode, dp_group=None)).backward()
    full_grad = theta.grad.clone()
    (micro,) = shard_plan(BATCH, 1, gen)
    local = accumulated_grad(theta, micro, mask, lambda r, n: aggregate_loss(
        _per_token_loss(theta, r, n), mask[r, :n], LossNormalizer.for_mini_batch(mask[r, :n], mode, dp_group=None)))
    assert not torch.allclose(local, full_grad)


def test_padding_values_never_reach_the_loss_or_gradient() -> None:
    loss, mask, _ = _data(1)
    theta = loss.clone().requires_grad_(True)
    for pad in (float("nan"), float("inf"), float("-inf")):
        for mode in LOSS_AGG_MODES:
            poisoned = torch.where(mask, theta, torch.tensor(pad, dtype=theta.dtype)) * 2.0
            out = aggregate_loss(poisoned, mask, LossNormalizer.for_mini_batch(mask, mode, dp_group=None))
            (grad,) = torch.autograd.grad(out, theta)
            assert torch.isfinite(out) and torch.isfinite(grad).all()
            assert not bool(grad[~mask].any())


def test_fully_masked_mini_batch_gives_zero_loss() -> None:
    mask = torch.zeros(3, 4, dtype=torch.bool)
    for mode in LOSS_AGG_MODES:
        out = aggregate_loss(torch.randn(3, 4), mask, LossNormalizer.for_mini_batch(mask, mode, dp_group=None))
        assert out.item() == 0.0


def test_low_precision_loss_and_mean_reduction_scale() -> None:
    loss, mask, _ = _data(2)
    norm = LossNormalizer.from_shard_masks([mask[:7], mask[7:]], "token-mean", grad_reduction="mean")
    assert norm.grad_scale == 2.0 and norm.num_tokens == float(mask.sum())
    out = aggregate_loss(loss.to(torch.bfloat16), mask, norm)
    expected = 2.0 * ref.aggregate(loss.tolist(), mask.tolist(), "token-mean", LENGTH)
    assert out.dtype == torch.bfloat16 and out.item() == pytest.approx(expected, rel=2e-2)


def test_misuse_is_rejected_with_a_fix() -> None:
    loss, mask, _ = _data(0)
    with pytest.raises(TypeError, match="LossNormalizer.for_mini_batch"):
        aggregate_loss(loss, mask, "token-mean")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="actor.loss_agg_mode='mean'.*token-mean"):
        LossNormalizer.for_mini_batch(mask, "mean", dp_group=None)
    with pytest.raises(TypeError, match="dp_group"):
        LossNormalizer.for_mini_batch(mask, "token-mean")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="grad_reduction"):
        LossNormalizer.for_mini_batch(mask, "token-mean", dp_group=None, grad_reduction="avg")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="loss_scale_factor"):
        LossNormalizer.for_mini_batch(mask, "seq-mean-token-sum-norm", dp_group=None, loss_scale_factor=0.0)
    with pytest.raises(ValueError, match="one shape"):
        aggregate_loss(loss[:, :3], mask, LossNormalizer.for_mini_batch(mask, "token-mean", dp_group=None))
    with pytest.raises(ValueError, match="only used by seq-mean-token-sum-norm"):
        LossNormalizer(loss_agg_mode="token-mean", num_tokens=3.0, num_seqs=1.0, loss_scale_factor=4.0)
    with pytest.raises(ValueError, match="shard_masks is empty"):
        LossNormalizer.from_shard_masks([], "token-mean")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, port: int, masks: list[torch.Tensor], out_dir: str) -> None:
    dist.init_process_group(get_dist_backend(), init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        results = {
            (mode, reduction): LossNormalizer.for_mini_batch(masks[rank], mode, dp_group=dist.group.WORLD,
                                                             grad_reduction=reduction)
            for mode in LOSS_AGG_MODES for reduction in ("mean", "sum")
        }
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_all_reduced_normaliser_equals_the_one_from_all_shards() -> None:
    # Two real gloo ranks holding shards of different padded lengths (8 and 11 columns).
    gen = torch.Generator().manual_seed(5)
    masks = [ref.random_mask(5, 8, gen, empty_rows=1), ref.random_mask(6, 11, gen, empty_rows=0)]
    with tempfile.TemporaryDirectory() as out_dir:
        # fork, not spawn: a spawned child re-imports torch and this module (~10 s on 2 cores)
        mp.start_processes(_rank_main, args=(_free_port(), masks, out_dir), nprocs=2, join=True, start_method="fork")
        per_rank = [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(2)]
    for (mode, reduction), got in per_rank[0].items():
        expected = LossNormalizer.from_shard_masks(masks, mode, grad_reduction=reduction)
        assert got == expected == per_rank[1][(mode, reduction)]
    assert per_rank[0][("seq-mean-token-sum-norm", "sum")].loss_scale_factor == 11.0
