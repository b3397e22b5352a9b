"""The online-DPO update of the actor: one optimizer step per mini-batch of (chosen, rejected) pairs.

The driver (verl_like/trainer/online_dpo_step.py) sends rows in pairs: row 2i is pair i's chosen sample, row 2i+1
its rejected one, with "ref_log_probs" and "response_mask" (zeroed for a skipped pair). The config checks
(config/online_dpo.py) keep pairs whole through the data-parallel split, the unshuffled mini-batches and the
micro-batches, so each micro-batch's loss sees both halves of its pairs. The mean is over the valid pairs of the
mini-batch on every rank: `LossNormalizer.num_seqs` counts rows with a valid token, i.e. two per valid pair.
"""

from __future__ import annotations

import torch

from verl_like.algorithms import LossNormalizer
from verl_like.algorithms.dpo import dpo_loss, sequence_log_probs
from verl_like.config.online_dpo import OnlineDPOConfig
from verl_like.engine.base import LossFn
from verl_like.engine.model_outputs import response_mask_of
from verl_like.protocol import DataProto
from verl_like.workers.actor import PPOActor
from verl_like.workers.ppo_update import mean_metrics, metric_entries, run_ppo_update
from verl_like.workers.train_request import TrainRequest

_MODEL_KEYS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask", "ref_log_probs")


def update_policy_dpo(actor: PPOActor, batch: DataProto, config: OnlineDPOConfig) -> dict[str, float]:
    """Runs the DPO update on this rank's pair rows; returns actor/dpo_* metrics (means over the steps).

    Metrics: actor/dpo_loss, actor/dpo_rewards_chosen and _rejected (beta x log-ratio to the reference, the
    implicit reward), actor/dpo_rewards_margin, actor/dpo_rewards_accuracy (share of pairs whose implicit reward
    ranks them as the judge did), actor/dpo_logratio_chosen and _rejected (log pi - log pi_ref, summed over the
    response), actor/dpo_logps_chosen and _rejected, actor/grad_norm, actor/lr. Pair means are over valid pairs.
    """
    missing = [key for key in _MODEL_KEYS if key not in batch.batch.keys()]
    if missing:
        raise KeyError(f"update_policy_dpo: the batch lacks {missing}; it has {sorted(batch.batch.keys())}")
    if len(batch) % 2:
        raise ValueError(f"update_policy_dpo: {len(batch)} rows on this rank; rows must come in (chosen, rejected) pairs")
    rows = batch.select(batch_keys=list(_MODEL_KEYS), non_tensor_keys=[], meta_keys=[])
    temperature = TrainRequest.from_meta_info(batch.meta_info).temperature
    history = run_ppo_update(
        actor.engine,
        rows,
        actor.config,
        lambda normalizer: _dpo_loss_fn(normalizer, config),
        rollout_n=2,  # ppo_mini_batch_size counts prompts, i.e. pairs: 2 rows each
        temperature=1.0 if temperature is None else temperature,
    )
    return mean_metrics(history, "actor")


def _dpo_loss_fn(normalizer: LossNormalizer, config: OnlineDPOConfig) -> LossFn:
    valid_pairs = normalizer.num_seqs / 2

    def loss_fn(outputs: dict[str, torch.Tensor], micro_batch: DataProto) -> tuple[torch.Tensor, dict]:
        tensors = micro_batch.batch
        mask = response_mask_of(tensors)
        if mask.shape[0] % 2:
            raise ValueError(f"a DPO micro-batch holds {mask.shape[0]} rows, not whole (chosen, rejected) pairs")
        policy = sequence_log_probs(outputs["log_probs"], mask).view(-1, 2)
        reference = sequence_log_probs(tensors["ref_log_probs"], mask).view(-1, 2)
        valid = (mask.sum(-1) > 0).view(-1, 2).all(-1)
        out = dpo_loss(
            policy[:, 0], policy[:, 1], reference[:, 0], reference[:, 1],
            beta=config.beta, loss_type=config.loss_type, label_smoothing=config.label_smoothing,
        )
        weights = valid.to(out.losses.dtype)
        loss = (out.losses * weights).sum() / max(valid_pairs, 1.0)
        chosen, rejected = out.chosen_rewards, out.rejected_rewards

        def pair_mean(values: torch.Tensor) -> torch.Tensor:
            return (values.detach().double() * weights).sum() / weights.sum().clamp_min(1)

        means = {
            "dpo_rewards_chosen": pair_mean(chosen),
            "dpo_rewards_rejected": pair_mean(rejected),
            "dpo_rewards_margin": pair_mean(chosen - rejected),
            "dpo_rewards_accuracy": pair_mean((chosen > rejected).double()),
            "dpo_logratio_chosen": pair_mean(chosen / config.beta),
            "dpo_logratio_rejected": pair_mean(rejected / config.beta),
            "dpo_logps_chosen": pair_mean(policy[:, 0]),
            "dpo_logps_rejected": pair_mean(policy[:, 1]),
        }
        # Pair means weighted by the micro-batch's valid pairs (metric_entries weights by the mask's sum).
        return loss, metric_entries({"dpo_loss": loss}, means, valid.unsqueeze(-1))

    return loss_fn
