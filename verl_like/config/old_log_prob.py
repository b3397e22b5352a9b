"""`actor_rollout_ref.actor.recompute_old_log_prob: null` (auto), decided once on the driver when the config is loaded.

PPO's "old" log-probs are the actor's, under the weights it holds when the update starts. When the update makes
exactly one optimizer step over the batch (ppo_epochs=1 and one mini-batch: ppo_mini_batch_size equal to
data.train_batch_size), those are the log-probs that step's own forward computes, so the separate forward over the
batch before the update (`compute_log_prob`) can be skipped: the loss takes the forward's values, detached, as the
old ones (ratio exactly 1, the same gradient), and the update reports the rollout-vs-trainer gap
(rollout/logprob_diff_*) from that forward. TRL skips it under the same condition when its vLLM correction is off.

Auto skips it exactly then, unless the old log-probs are needed before the update: algorithm.use_kl_in_reward (the
KL penalty is part of the rewards the advantages read). With algorithm.rollout_is the update computes the IS
weights from that same forward, per row as the driver would (rollout_is/* metrics reduced over the batch). true
always recomputes; false skips and is refused, naming the key, where it cannot. A batch whose rollout was asked for
its log-probs and returned none (a text hook's) is still recomputed: that forward supplies its rollout_log_probs.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from verl_like.config.ppo import PPOConfig

logger = logging.getLogger(__name__)

KEY = "actor_rollout_ref.actor.recompute_old_log_prob"


def needs_recompute(config: PPOConfig) -> str | None:
    """Why the update cannot take its own forward's log-probs as the old ones (None: it can)."""
    actor, algo = config.actor_rollout_ref.actor, config.algorithm
    if actor.ppo_epochs != 1:
        return f"actor.ppo_epochs={actor.ppo_epochs} (later epochs need the log-probs before the first step)"
    if actor.ppo_mini_batch_size != config.data.train_batch_size:
        return (f"actor.ppo_mini_batch_size={actor.ppo_mini_batch_size} != data.train_batch_size="
                f"{config.data.train_batch_size} (several optimizer steps per batch)")
    if algo.use_kl_in_reward:
        return "algorithm.use_kl_in_reward=true (the KL penalty enters the rewards before the update)"
    return None


def resolve_old_log_prob(config: PPOConfig) -> PPOConfig:
    """`config` with a null recompute_old_log_prob replaced by auto's decision (logged); raises when it is false
    but the update needs the old log-probs first. The same object when the key is set and consistent."""
    actor = config.actor_rollout_ref.actor
    if actor.recompute_old_log_prob is True:
        return config
    if actor.recompute_old_log_prob is False:
        reason = needs_recompute(config)
        if reason is not None:
            raise ValueError(f"{KEY}=false takes the old log-probs from the update's own forward, which needs one "
                             f"optimizer step per batch and no use of them before it; here {reason}. Set it to "
                             "null (auto) or true")
        return config
    reason = needs_recompute(config)
    recompute = reason is not None
    logger.info("%s=auto: %s (%s)", KEY, str(recompute).lower(),
                reason or "one optimizer step per batch: the update's own forward gives them")
    arr = config.actor_rollout_ref
    arr = dataclasses.replace(arr, actor=dataclasses.replace(actor, recompute_old_log_prob=recompute))
    return dataclasses.replace(config, actor_rollout_ref=arr)
