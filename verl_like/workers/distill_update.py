"""The actor's update with on-policy distillation: coef x the top-k divergence to the teacher, plus (optionally)
the RL policy loss, in the PPO mini-batch loop.

The batch carries "teacher_topk_ids" / "teacher_topk_log_probs" `(batch, response_len, k)` from the teacher role;
the engine, seeing "teacher_topk_ids" in a micro-batch, also returns the student's "topk_log_probs" at those ids
(engine/model_outputs.py). The divergence is aggregated like the policy loss (actor.loss_agg_mode, global
normaliser), so micro-batches and ranks add up to the mini-batch loss.
"""

from __future__ import annotations

import torch

from verl_like.algorithms import LossNormalizer, aggregate_loss, masked_mean
from verl_like.algorithms.distillation import topk_divergence
from verl_like.config.distillation import DistillationConfig
from verl_like.engine.base import LossFn
from verl_like.engine.model_outputs import TOPK_IDS_KEY, response_mask_of
from verl_like.protocol import DataProto
from verl_like.workers.actor import PPOActor, rollout_gap_metrics
from verl_like.workers.ppo_update import mean_metrics, metric_entries, run_ppo_update
from verl_like.workers.train_request import ROLLOUT_IS_KEY, TrainRequest

_TEACHER_KEYS = (TOPK_IDS_KEY, "teacher_topk_log_probs")
_MODEL_KEYS = ("input_ids", "attention_mask", "position_ids", "responses")


def update_policy_distill(actor: PPOActor, batch: DataProto, config: DistillationConfig,
                          request: TrainRequest | None = None) -> dict[str, float]:
    """Runs the actor's update with the distillation term on this rank's rows; returns the metrics. `request`: the
    rollout's temperature (workers/train_request.py; None: the batch's meta_info).

    Metrics: actor/distill_loss (the aggregated divergence), actor/distill_divergence (its token mean), and with
    use_policy_loss the PPO actor's metrics (actor/pg_loss, ...); actor/grad_norm, actor/lr.
    """
    missing = [key for key in _TEACHER_KEYS if key not in batch.batch.keys()]
    if missing:
        raise KeyError(
            f"update_policy_distill: the batch lacks {missing} (the teacher role's compute_teacher_topk output); it "
            f"has {sorted(batch.batch.keys())}"
        )
    request = request or TrainRequest.from_meta_info(batch.meta_info)
    if request.temperature is None:
        raise KeyError("update_policy_distill: batch.meta_info['temperature'] is unset; set the rollout's")
    if config.use_policy_loss:
        rows = actor.training_rows(batch).union(
            batch.select(batch_keys=list(_TEACHER_KEYS), non_tensor_keys=[], meta_keys=[])
        )
    else:
        keys = list(_MODEL_KEYS) + list(_TEACHER_KEYS)
        keys += ["response_mask"] if "response_mask" in batch.batch.keys() else []
        rows = batch.select(batch_keys=keys, non_tensor_keys=[], meta_keys=[])
    policy_config = actor.config
    history = run_ppo_update(
        actor.engine,
        rows,
        policy_config,
        lambda normalizer: _distill_loss_fn(actor, normalizer, config, batch.meta_info.get(ROLLOUT_IS_KEY)),
        rollout_n=actor.rollout_n,
        loss_scale_factor=policy_config.loss_scale_factor,
        temperature=request.temperature,
        calculate_entropy=config.use_policy_loss and policy_config.entropy_coeff != 0,
    )
    return rollout_gap_metrics(mean_metrics(history, "actor"))


def _distill_loss_fn(actor: PPOActor, normalizer: LossNormalizer, config: DistillationConfig,
                     rollout_is=None) -> LossFn:
    policy_loss_fn = actor.make_loss_fn(normalizer, rollout_is) if config.use_policy_loss else None

    def loss_fn(outputs: dict[str, torch.Tensor], micro_batch: DataProto) -> tuple[torch.Tensor, dict]:
        tensors = micro_batch.batch
        mask = response_mask_of(tensors)
        divergence = topk_divergence(outputs["topk_log_probs"], tensors["teacher_topk_log_probs"], config.loss)
        distill = aggregate_loss(divergence, mask, normalizer)
        entries = metric_entries(
            {"distill_loss": distill}, {"distill_divergence": masked_mean(divergence.detach(), mask.bool())}, mask
        )
        loss = config.coef * distill
        if policy_loss_fn is not None:
            policy_loss, policy_entries = policy_loss_fn(outputs, micro_batch)
            loss = loss + policy_loss
            entries = {**policy_entries, **entries}
        return loss, entries

    return loss_fn
