"""The distillation loss function of the actor's update: micro-batch shares add up, and mixing adds the PPO loss."""

from __future__ import annotations

import torch

from verl_like.algorithms import LossNormalizer, aggregate_loss
from verl_like.algorithms.distillation import topk_divergence
from verl_like.config.actor import ActorConfig
from verl_like.config.distillation import DistillationConfig
from verl_like.protocol import DataProto
from verl_like.workers.actor import PPOActor
from verl_like.workers.distill_update import _distill_loss_fn

ROWS, LENGTH, K = 6, 5, 3


def _batch(seed: int) -> tuple[DataProto, dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.arange(LENGTH)[None] < torch.randint(1, LENGTH + 1, (ROWS, 1), generator=gen)).long()
    teacher = torch.log_softmax(torch.randn(ROWS, LENGTH, 16, generator=gen), -1)[..., :K]
    student = torch.log_softmax(torch.randn(ROWS, LENGTH, 16, generator=gen), -1)[..., :K]
    log_probs = torch.log_softmax(torch.randn(ROWS, LENGTH, 16, generator=gen), -1)[..., 0]
    batch = DataProto.from_dict(tensors={
        "response_mask": mask, "responses": torch.zeros(ROWS, LENGTH, dtype=torch.long),
        "teacher_topk_log_probs": teacher, "old_log_probs": log_probs.detach() - 0.1,
        "advantages": torch.randn(ROWS, LENGTH, generator=gen),
    })
    return batch, {"topk_log_probs": student, "log_probs": log_probs}


def _actor() -> PPOActor:
    return PPOActor(engine=None, config=ActorConfig(ppo_micro_batch_size_per_gpu=2), rollout_n=1)  # type: ignore[arg-type]


def test_micro_batch_shares_sum_to_coef_times_the_aggregated_divergence() -> None:
    batch, outputs = _batch(0)
    mask = batch.batch["response_mask"]
    normalizer = LossNormalizer.for_mini_batch(mask, "token-mean", dp_group=None, grad_reduction="sum")
    config = DistillationConfig(loss="reverse_kl", coef=0.5, top_k=K)
    loss_fn = _distill_loss_fn(_actor(), normalizer, config)
    total = sum(
        float(loss_fn({k: v[rows] for k, v in outputs.items()}, batch[rows])[0]) for rows in ([0, 1, 2], [3], [4, 5])
    )
    divergence = topk_divergence(outputs["topk_log_probs"], batch.batch["teacher_topk_log_probs"], "reverse_kl")
    assert abs(total - 0.5 * float(aggregate_loss(divergence, mask, normalizer))) < 1e-6


def test_use_policy_loss_adds_the_ppo_actor_loss() -> None:
    batch, outputs = _batch(1)
    normalizer = LossNormalizer.for_mini_batch(batch.batch["response_mask"], "token-mean", dp_group=None)
    actor = _actor()
    alone, _ = _distill_loss_fn(actor, normalizer, DistillationConfig(top_k=K))(outputs, batch)
    mixed, metrics = _distill_loss_fn(actor, normalizer, DistillationConfig(top_k=K, use_policy_loss=True))(
        outputs, batch
    )
    ppo, _ = actor.make_loss_fn(normalizer)(outputs, batch)
    assert abs(float(mixed) - float(alone) - float(ppo)) < 1e-6
    assert {"share/pg_loss", "share/distill_loss", "weighted/distill_divergence"} <= set(metrics)
