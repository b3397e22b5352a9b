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

`actor_rollout_ref.rollout.log_probs_from: null` (auto) decides how they are made where they are asked for:
"rescore" (the decode asks for none; the finished samples are scored in one prompt-log-prob pass, one prefill per
sample: GPU work instead of per-step host work) on CUDA where rescoring gives the same values, "decode" otherwise:
off CUDA (rescoring there is a second forward of the whole batch on the CPU), with sampling that rescoring cannot
reproduce (temperature other than 1, top-k, top-p), with async_training.partial_rollout (a sample frozen across a
weight update would be scored by the new weights), and where agent loops run the rollout (they decode regardless).
Explicit "rescore" where it cannot apply is refused, naming the keys.
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
    """Why the rollout's log-probs cannot come from a rescoring pass in this run (None: they can)."""
    from verl_like.config.rollout import rescorable, uses_agent_loops

    rollout = config.actor_rollout_ref.rollout
    if not rescorable(rollout.temperature, rollout.top_p, rollout.top_k, rollout.do_sample):
        return (f"the rollout samples with temperature={rollout.temperature}, top_p={rollout.top_p}, "
                f"top_k={rollout.top_k}, and rescoring gives the temperature-1 log-softmax")
    if config.async_training.enable and config.async_training.partial_rollout:
        return "async_training.partial_rollout=true (a sample frozen across a weight update spans two versions)"
    if uses_agent_loops(rollout):
        return "agent loops run the rollout (they take the decode's log-probs)"
    full = rollout.prompt_length + rollout.response_length
    if rollout.max_model_len is not None and rollout.max_model_len <= full:
        return (f"actor_rollout_ref.rollout.max_model_len={rollout.max_model_len} leaves no room to score a whole "
                f"sequence of {full} tokens as a prompt (vLLM wants one more)")
    return None


def choose_log_probs_from(config: PPOConfig) -> tuple[str, str]:
    """Auto's "decode" or "rescore" for `config` (whose rollout asks for log-probs), and its reason."""
    if config.trainer.device != "cuda":
        return "decode", f"trainer.device={config.trainer.device}: a rescoring pass would be a second CPU forward"
    reason = cannot_rescore(config)
    if reason is not None:
        return "decode", reason
    return "rescore", ("on CUDA one prompt-log-prob pass over the finished samples replaces vLLM's per-token host "
                       "work in the decode")


def resolve_calculate_log_probs(config: PPOConfig) -> PPOConfig:
    """`config` with a null calculate_log_probs and a null log_probs_from replaced by auto's decisions (logged);
    raises for false with algorithm.rollout_is and for rescore where it cannot apply. The same object when both
    keys are set."""
    rollout = config.actor_rollout_ref.rollout
    if rollout.calculate_log_probs is False and config.algorithm.rollout_is:
        raise ValueError(f"{KEY}=false but algorithm.rollout_is=true computes its weights from them; set {KEY} to "
                         "null (auto) or true, or algorithm.rollout_is=false")
    if rollout.log_probs_from == "rescore":
        reason = cannot_rescore(config)
        if reason is not None:
            raise ValueError(f"{FROM_KEY}=rescore cannot give this run's log-probs: {reason}; set {FROM_KEY}=decode "
                             "or null (auto)")
    calculate = rollout.calculate_log_probs
    if calculate is None:
        calculate, reason = choose_calculate_log_probs(config.trainer.device, config.algorithm.rollout_is)
        logger.info("%s=auto: %s (%s)", KEY, str(calculate).lower(), reason)
    source = rollout.log_probs_from
    if source is None:
        source, reason = choose_log_probs_from(config) if calculate else ("decode", f"{KEY}=false")
        if calculate:
            logger.info("%s=auto: %s (%s)", FROM_KEY, source, reason)
    if (calculate, source) == (rollout.calculate_log_probs, rollout.log_probs_from):
        return config
    arr = config.actor_rollout_ref
    new_rollout = dataclasses.replace(rollout, calculate_log_probs=calculate, log_probs_from=source)
    return dataclasses.replace(config, actor_rollout_ref=dataclasses.replace(arr, rollout=new_rollout))
