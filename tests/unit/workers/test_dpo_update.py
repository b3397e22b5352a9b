"""The DPO loss function the actor's update runs: micro-batch shares add up to the mean over valid pairs."""

from __future__ import annotations

import torch

from verl_like.algorithms import LossNormalizer
from verl_like.algorithms.dpo import dpo_loss
from verl_like.config.online_dpo import OnlineDPOConfig
from verl_like.protocol import DataProto
from verl_like.workers.dpo_update import _dpo_loss_fn

PAIRS, LENGTH = 4, 5


def _pair_rows(seed: int) -> tuple[DataProto, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    mask = torch.ones(2 * PAIRS, LENGTH, dtype=torch.long)
    mask[:, 3:] = (torch.rand(2 * PAIRS, 2, generator=gen) > 0.5).long().cummin(-1).values
    mask[2:4] = 0  # pair 1 skipped (a tie)
    ref_lp = -torch.rand(2 * PAIRS, LENGTH, generator=gen, dtype=torch.float64)
    log_probs = ref_lp + 0.3 * torch.randn(2 * PAIRS, LENGTH, generator=gen, dtype=torch.float64)
    batch = DataProto.from_dict(
        tensors={"response_mask": mask, "ref_log_probs": ref_lp, "responses": torch.zeros(2 * PAIRS, LENGTH)}
    )
    return batch, log_probs


def test_micro_batch_shares_sum_to_the_mean_loss_over_valid_pairs() -> None:
    batch, log_probs = _pair_rows(0)
    mask = batch.batch["response_mask"]
    normalizer = LossNormalizer.for_mini_batch(mask, "token-mean", dp_group=None, grad_reduction="sum")
    config = OnlineDPOConfig(enable=True, beta=0.2)
    loss_fn = _dpo_loss_fn(normalizer, config)
    total = 0.0
    for rows in ([0, 1, 2, 3], [4, 5], [6, 7]):
        loss, metrics = loss_fn({"log_probs": log_probs[rows]}, batch[rows])
        total += float(loss)
    seq = (log_probs * mask).sum(-1).view(-1, 2)
    ref_seq = (batch.batch["ref_log_probs"] * mask).sum(-1).view(-1, 2)
    expected = dpo_loss(seq[:, 0], seq[:, 1], ref_seq[:, 0], ref_seq[:, 1], beta=0.2).losses
    valid = torch.tensor([True, False, True, True])
    assert abs(total - float(expected[valid].mean())) < 1e-12


def test_skipped_pair_gets_no_gradient() -> None:
    batch, log_probs = _pair_rows(1)
    normalizer = LossNormalizer.for_mini_batch(batch.batch["response_mask"], "token-mean", dp_group=None)
    log_probs = log_probs.clone().requires_grad_(True)
    loss, _ = _dpo_loss_fn(normalizer, OnlineDPOConfig(enable=True))({"log_probs": log_probs}, batch)
    (grad,) = torch.autograd.grad(loss, log_probs)
    assert grad[2:4].abs().sum() == 0 and grad[[0, 1, 4, 5]].abs().sum() > 0
