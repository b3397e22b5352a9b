"""`actor_rollout_ref.rollout.calculate_log_probs: null` (auto), decided once on the driver when the config is loaded.

The rollout's own log-probs of its sampled tokens (`rollout_log_probs`) feed two things: the rollout IS weights
(algorithm.rollout_is) and the rollout-vs-trainer gap metric (rollout/logprob_diff_*). Nothing else reads them:
the update's old log-probs are the trainer's. On a GPU they are not free: vLLM does host work per request and
decode step for them, and at small model sizes the decode is bound by that host work (0.5B, 256 sequences: 4.3 s
with them, 2.3 s without, docs/benchmarks.md). So auto asks for them where they are needed or cheap: true with
algorithm.rollout_is or off CUDA (trainer.device=cpu, where the gap metric is the pipeline's check in tests), false
on CUDA otherwise (verl's default). The weight sync's own check (rollout/sync_check.py) scores a probe after every
sync either way. false with algorithm.rollout_is is refused, naming both keys.

Only the in-process vLLM engine skips them; server mode, agent loops and the HF engine return them regardless.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from verl_like.config.ppo import PPOConfig

logger = logging.getLogger(__name__)

KEY = "actor_rollout_ref.rollout.calculate_log_probs"


def choose_calculate_log_probs(device: str, rollout_is: bool) -> tuple[bool, str]:
    """Auto's decision and its reason for trainer.device `device` and algorithm.rollout_is `rollout_is`."""
    if rollout_is:
        return True, "algorithm.rollout_is=true reads them"
    if device != "cuda":
        return True, f"trainer.device={device}: cheap there, and they give the rollout-vs-trainer gap metric"
    return False, ("trainer.device=cuda without algorithm.rollout_is: nothing needs them, and vLLM's host work for "
                   "them slows the decode; set it to true for the rollout/logprob_diff_* metrics")


def resolve_calculate_log_probs(config: PPOConfig) -> PPOConfig:
    """`config` with a null calculate_log_probs replaced by auto's decision (logged); raises for false with
    algorithm.rollout_is. The same object when the key is set."""
    rollout = config.actor_rollout_ref.rollout
    if rollout.calculate_log_probs is False and config.algorithm.rollout_is:
        raise ValueError(f"{KEY}=false but algorithm.rollout_is=true computes its weights from them; set {KEY} to "
                         "null (auto) or true, or algorithm.rollout_is=false")
    if rollout.calculate_log_probs is not None:
        return config
    value, reason = choose_calculate_log_probs(config.trainer.device, config.algorithm.rollout_is)
    logger.info("%s=auto: %s (%s)", KEY, str(value).lower(), reason)
    arr = config.actor_rollout_ref
    arr = dataclasses.replace(arr, rollout=dataclasses.replace(rollout, calculate_log_probs=value))
    return dataclasses.replace(config, actor_rollout_ref=arr)
