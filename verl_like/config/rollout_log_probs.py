"""`actor_rollout_ref.rollout.calculate_log_probs: null` (auto), decided once on the driver when the config is loaded.

The rollout's own log-probs of its sampled tokens (`rollout_log_probs`) feed two things: the rollout IS weights
(algorithm.rollout_is) and the rollout-vs-trainer gap metric (rollout/logprob_diff_*). Nothing else reads them:
the update's old log-probs are the trainer's. On a GPU they are not free: vLLM does host work per request and
decode step for them, and at small model sizes the decode is bound by that host work (0.5B, 256 sequences: 4.3 s
with them, 2.3 s without, docs/benchmarks.md). So auto asks for them where they are needed or cheap: true with
algorithm.rollout_is or off CUDA (trainer.device=cpu, where the gap metric is the pipeline's check in tests), false
on CUDA otherwise (verl's default). The weight sync's own check (rollout/sync_check.py) scores a probe after every
sync either way. false with algorithm.rollout_is is refused, naming both keys. The in-process vLLM engine and our
servers skip them when false; agent loops and the HF engine return them regardless.

`actor_rollout_ref.rollout.log_probs_from` says how they are made where they are asked for: "decode" (the default:
vLLM's per-token log-probs) or "rescore" (the decode asks for none; the finished samples are scored in one
prompt-log-prob pass, one prefill per sample: GPU work in place of per-step host work). "rescore" is refused where
it would not give the decode's values: sampling other than temperature 1 without top-k/top-p, async_training's
partial rollout (a sample frozen across a weight update would be scored by the new weights), agent loops (they
decode regardless), and a max_model_len with no room for a whole sequence plus one token. It is opt-in: where it
pays depends on the model's size (a prefill of every sample against vLLM's per-step host work); measured at 0.5B
only (one H100, staleness 1: 4.35 s per step against 5.03 s decoding, docs/benchmarks.md).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from verl_like.config.ppo import PPOConfig

logger = logging.getLogger(__name__)

KEY = "actor_rollout_ref.rollout.calculate_log_probs"
FROM_KEY = "actor_rollout_ref.rollout.log_probs_from"


def choose_calculate_log_probs(device: str, rollout_is: bool) -> tuple[bool, str]:
    """Auto's decision and its reason for trainer.device `device` and algorithm.rollout_is `rollout_is`."""
    if rollout_is:
        return True, "algorithm.rollout_is=true reads them"
    if device != "cuda":
        return True, f"trainer.device={device}: cheap there, and they give the rollout-vs-trainer gap metric"
    return False, ("trainer.device=cuda without algorithm.rollout_is: nothing needs them, and vLLM's host work for "
                   "them slows the decode; set it to true for the rollout/logprob_diff_* metrics")


def cannot_rescore(config: PPOConfig) -> str | None:
    """Why the rollout's log-probs cannot come from a rescoring pass in this run, beyond the rollout node's own
    checks (sampling, max_model_len: config/rollout.py); None: they can."""
    from verl_like.config.rollout import uses_agent_loops

    if config.async_training.enable and config.async_training.partial_rollout:
        return "async_training.partial_rollout=true (a sample frozen across a weight update spans two versions)"
    if uses_agent_loops(config.actor_rollout_ref.rollout):
        return "agent loops run the rollout (they take the decode's log-probs)"
    return None


def resolve_calculate_log_probs(config: PPOConfig) -> PPOConfig:
    """`config` with a null calculate_log_probs replaced by auto's decision (logged); raises for false with
    algorithm.rollout_is and for log_probs_from=rescore where it cannot apply. The same object when the key is
    set."""
    rollout = config.actor_rollout_ref.rollout
    if rollout.calculate_log_probs is False and config.algorithm.rollout_is:
        raise ValueError(f"{KEY}=false but algorithm.rollout_is=true computes its weights from them; set {KEY} to "
                         "null (auto) or true, or algorithm.rollout_is=false")
    if rollout.log_probs_from == "rescore":
        reason = cannot_rescore(config)
        if reason is not None:
            raise ValueError(f"{FROM_KEY}=rescore cannot give this run's log-probs: {reason}; set {FROM_KEY}=decode")
    if rollout.calculate_log_probs is not None:
        return config
    value, reason = choose_calculate_log_probs(config.trainer.device, config.algorithm.rollout_is)
    logger.info("%s=auto: %s (%s)", KEY, str(value).lower(), reason)
    arr = config.actor_rollout_ref
    arr = dataclasses.replace(arr, rollout=dataclasses.replace(rollout, calculate_log_probs=value))
    return dataclasses.replace(config, actor_rollout_ref=arr)
