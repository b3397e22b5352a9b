"""ReferencePolicy: log-probs of the frozen initial policy (for the KL loss or the KL reward penalty).

A plain class around a TrainEngine built without an optimizer (`engine/from_config.reference_engine_config`); the
worker that hosts it (ActorRolloutWorker) constructs it:

    ref = ReferencePolicy(build_engine(reference_engine_config(actor_engine_config, ref_node), strategy, megatron))
    ref_log_probs = ref.compute_ref_log_prob(batch)   # "ref_log_probs", at batch.meta_info["temperature"]

With a LoRA actor the reference is the actor's own engine with its adapter disabled (`adapter_disabled=True`):
no second copy of the base model, which the adapter leaves frozen.

    ref = ReferencePolicy(actor_engine, adapter_disabled=True)
"""

from __future__ import annotations

import contextlib
import logging

from verl_like.engine.base import TrainEngine
from verl_like.protocol import DataProto
from verl_like.workers.train_request import TrainRequest

logger = logging.getLogger(__name__)


class ReferencePolicy:
    """The reference role: `compute_ref_log_prob` with the engine it is given (a causal LM, inference only)."""

    def __init__(self, engine: TrainEngine, adapter_disabled: bool = False) -> None:
        self.engine = engine
        self.adapter_disabled = adapter_disabled

    def compute_ref_log_prob(self, batch: DataProto, temperature: float | None = None) -> DataProto:
        """"ref_log_probs" `(batch, response_len)` of this rank's rows.

        `temperature`: the rollout's; None reads batch.meta_info["temperature"].
        """
        if temperature is None:
            temperature = TrainRequest.from_meta_info(batch.meta_info).temperature
        if temperature is None:
            raise KeyError(
                "ReferencePolicy.compute_ref_log_prob: pass temperature= or set batch.meta_info['temperature'] "
                "to the rollout's sampling temperature"
            )
        with self.engine.adapter_disabled() if self.adapter_disabled else contextlib.nullcontext():
            outputs = self.engine.forward(batch, temperature=temperature)
        return outputs.rename("log_probs", "ref_log_probs")
