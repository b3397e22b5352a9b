"""ReferencePolicy: log-probs of the frozen initial policy (for the KL loss or the KL reward penalty).

A plain class around a TrainEngine built without an optimizer (`reference_engine_config`); the worker that hosts
it (ActorRolloutWorker) constructs it:

    ref = ReferencePolicy(FSDPEngine(reference_engine_config(actor_engine_config)))
    ref_log_probs = ref.compute_ref_log_prob(batch)   # "ref_log_probs", at batch.meta_info["temperature"]

With a LoRA actor the reference is the actor's own engine with the adapters disabled; that variant is not built.
"""

from __future__ import annotations

import dataclasses
import logging

from verl_like.config.model import RefConfig
from verl_like.engine.base import TrainEngine
from verl_like.engine.config import EngineConfig
from verl_like.protocol import DataProto

logger = logging.getLogger(__name__)


def reference_engine_config(actor_engine_config: EngineConfig, ref: RefConfig | None = None) -> EngineConfig:
    """The actor's EngineConfig for a forward-only model (same weights, no optimizer).

    Without `ref` it keeps the actor's dtypes and micro-batching; with the `actor_rollout_ref.ref` node, its
    log_prob_* micro-batch keys and its fsdp_config (dtypes, param_offload, reshard_after_forward) apply.
    """
    config = dataclasses.replace(actor_engine_config, inference_only=True, optimizer_offload=False)
    if ref is None:
        return config
    fsdp = ref.fsdp_config
    return dataclasses.replace(
        config,
        micro_batch_size_per_rank=ref.log_prob_micro_batch_size_per_gpu,
        use_dynamic_bsz=ref.log_prob_use_dynamic_bsz,
        max_tokens_per_rank=ref.log_prob_max_token_len_per_gpu if ref.log_prob_use_dynamic_bsz else None,
        dtype=fsdp.model_dtype,
        param_dtype=fsdp.param_dtype,
        reduce_dtype=fsdp.reduce_dtype,
        param_offload=fsdp.param_offload,
        offload_policy=fsdp.offload_policy,
        reshard_after_forward=fsdp.reshard_after_forward,
    )


class ReferencePolicy:
    """The reference role: `compute_ref_log_prob` with the engine it is given (a causal LM, inference only)."""

    def __init__(self, engine: TrainEngine) -> None:
        self.engine = engine

    def compute_ref_log_prob(self, batch: DataProto, temperature: float | None = None) -> DataProto:
        """"ref_log_probs" `(batch, response_len)` of this rank's rows.

        `temperature`: the rollout's; None reads batch.meta_info["temperature"].
        """
        if temperature is None:
            if "temperature" not in batch.meta_info:
                raise KeyError(
                    "ReferencePolicy.compute_ref_log_prob: pass temperature= or set batch.meta_info['temperature'] "
                    "to the rollout's sampling temperature"
                )
            temperature = float(batch.meta_info["temperature"])
        outputs = self.engine.forward(batch, temperature=temperature)
        return outputs.rename("log_probs", "ref_log_probs")
