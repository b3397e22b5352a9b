"""The online-DPO step of the trainer loop (`online_dpo.enable`; docs/algorithms.md).

rollout (n samples per prompt) → judge: the run's reward (rule/custom scorer and/or reward model, as for PPO)
→ one (best, worst) pair per prompt (`select_preference_pairs`; all-equal prompts skipped or paired at random)
→ reference log-probs of the pair rows → DPO update (workers/dpo_update.py) → weight sync into the rollout engine.
It is the loop's update phase when online_dpo.enable (trainer/phases.py): data, rewards, the rollout phase,
validation, checkpoints and tracking are the loop's.
"""

from __future__ import annotations

import torch

from verl_like.algorithms.dpo import PreferencePairs, select_preference_pairs
from verl_like.protocol import DataProto
from verl_like.trainer.metrics import mean_metrics, timed
from verl_like.trainer.phases import StepContext
from verl_like.workers.train_request import TrainRequest


def pair_rows(batch: DataProto, pairs: PreferencePairs) -> DataProto:
    """The rollout rows of each pair, interleaved (chosen 2i, rejected 2i+1), with skipped pairs' response_mask 0."""
    order = torch.stack([pairs.chosen, pairs.rejected], dim=1).flatten()
    rows = batch[order.numpy()]
    keep = pairs.valid.repeat_interleave(2).unsqueeze(-1)
    rows.batch["response_mask"] = rows.batch["response_mask"] * keep.to(rows.batch["response_mask"].dtype)
    return rows


def judge_pairs(batch: DataProto, tie_breaking: str, seed: int) -> PreferencePairs:
    """The (chosen, rejected) pair of every prompt of a scored rollout batch (score: token_level_scores summed)."""
    uids = batch.non_tensor_batch["uid"]
    ids = {uid: i for i, uid in enumerate(dict.fromkeys(uids.tolist()))}
    group_ids = torch.tensor([ids[uid] for uid in uids.tolist()], dtype=torch.long)
    scores = batch.batch["token_level_scores"].sum(-1)
    generator = torch.Generator().manual_seed(seed)
    return select_preference_pairs(scores, group_ids, tie_breaking=tie_breaking, generator=generator)


def online_dpo_update(ctx: StepContext, batch: DataProto, timings: dict[str, float],
                      metrics: dict[str, float]) -> DataProto:
    """The online-DPO update phase on the rollout phase's scored `batch`; returns it (what throughput counts).

    Besides the actor/dpo_* update metrics: critic/score/{mean,max,min} of all samples, dpo/valid_pair_frac,
    dpo/score_chosen and dpo/score_rejected (judge scores of the valid pairs), response_length/*, timing_s/ref,
    update_actor, sync_weights.
    """
    cfg, c = ctx.config, ctx.components
    pairs = judge_pairs(batch, cfg.online_dpo.tie_breaking, seed=cfg.data.seed * 1_000_003 + ctx.global_step)
    rows = pair_rows(batch, pairs)
    temperature = TrainRequest.from_meta_info(batch.meta_info).temperature
    rows.meta_info.update(TrainRequest(
        temperature=cfg.actor_rollout_ref.rollout.temperature if temperature is None else temperature
    ).to_meta_info())
    with timed(timings, "ref"):
        ref = c.actor_rollout.compute_ref_log_prob(rows)
        metrics.update(mean_metrics(ref.meta_info.pop("metrics", {})))
        rows = rows.union(ref)
    rows.meta_info["online_dpo"] = cfg.online_dpo
    with timed(timings, "update_actor"):
        metrics.update(mean_metrics(c.actor_rollout.update_actor_dpo(rows)))
    with timed(timings, "sync_weights"):
        metrics.update(mean_metrics(c.rollout.sync_weights()))
    metrics.update(_pair_metrics(batch, pairs))
    return batch


def _pair_metrics(batch: DataProto, pairs: PreferencePairs) -> dict[str, float]:
    scores = batch.batch["token_level_scores"].sum(-1).double()
    lengths = batch.batch["response_mask"].sum(-1).double()
    valid = pairs.valid
    metrics = {
        "critic/score/mean": scores.mean().item(),
        "critic/score/max": scores.max().item(),
        "critic/score/min": scores.min().item(),
        "response_length/mean": lengths.mean().item(),
        "response_length/max": lengths.max().item(),
        "dpo/valid_pair_frac": valid.double().mean().item(),
    }
    if bool(valid.any()):
        metrics["dpo/score_chosen"] = scores[pairs.chosen[valid]].mean().item()
        metrics["dpo/score_rejected"] = scores[pairs.rejected[valid]].mean().item()
    return metrics



