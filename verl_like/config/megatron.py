"""`*.megatron`: the parallel layout of a role trained with `strategy=megatron` (verl's key names).

Data parallelism is what is left: dp = world / (tensor_model_parallel_size * pipeline_model_parallel_size).
"""

from __future__ import annotations

from dataclasses import dataclass

STRATEGIES = ("fsdp2", "megatron")
# verl's `fsdp` names its FSDP engine; here FSDP2 is the only FSDP engine, so both spellings mean it.
_STRATEGY_ALIASES = {"fsdp": "fsdp2", "fsdp2": "fsdp2", "megatron": "megatron"}


def canonical_strategy(key: str, value: str) -> str:
    """"fsdp2" or "megatron" for a `*.strategy` value (verl's "fsdp" reads as fsdp2); ValueError naming `key`."""
    if value not in _STRATEGY_ALIASES:
        raise ValueError(f"{key}={value!r} is not a training strategy; use one of {sorted(_STRATEGY_ALIASES)}")
    return _STRATEGY_ALIASES[value]


@dataclass(frozen=True)
class MegatronConfig:
    """Megatron-core parallel sizes of one role (actor, reference or critic).

    tensor_model_parallel_size: TP ranks per model replica; attention heads, KV groups and the FFN split over them
      (TP must divide num_key_value_heads).
    pipeline_model_parallel_size: pipeline stages; each holds a contiguous run of decoder layers (the first also
      the embedding, the last the final norm and the head).
    virtual_pipeline_model_parallel_size: model chunks per stage for the interleaved 1F1B schedule; null: plain
      1F1B. Needs pipeline_model_parallel_size > 1 and layers divisible by pp * vpp.
    sequence_parallel: split the layer norms' and dropouts' activations over the TP ranks along the sequence
      (needs tensor_model_parallel_size > 1). Refused for now: the local layer spec's norms do not support it.
    use_distributed_optimizer: shard the optimizer state over the data-parallel ranks (ZeRO-1); null: off. Its
      sharded state is not checkpointed yet, so true is refused with trainer.save_freq > 0; CPU (gloo) lacks the
      reduce-scatter it needs.
    seed: base seed of Megatron's model-parallel RNG.
    """

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: int | None = None
    sequence_parallel: bool = False
    use_distributed_optimizer: bool | None = None
    seed: int = 42

    def check(self, prefix: str) -> None:
        """Raises ValueError naming `prefix`.<key> for a size that cannot work on any world."""
        for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size"):
            if getattr(self, key) < 1:
                raise ValueError(f"{prefix}.{key}={getattr(self, key)} must be >= 1")
        vpp = self.virtual_pipeline_model_parallel_size
        if vpp is not None:
            if vpp < 1:
                raise ValueError(f"{prefix}.virtual_pipeline_model_parallel_size={vpp} must be >= 1 or null")
            if vpp > 1 and self.pipeline_model_parallel_size < 2:
                raise ValueError(
                    f"{prefix}.virtual_pipeline_model_parallel_size={vpp} needs pipeline_model_parallel_size > 1 "
                    f"(got {self.pipeline_model_parallel_size}); set it to null"
                )
        if self.sequence_parallel and self.tensor_model_parallel_size < 2:
            raise ValueError(
                f"{prefix}.sequence_parallel=true needs tensor_model_parallel_size > 1; set it to false"
            )
        if self.sequence_parallel:
            raise ValueError(
                f"{prefix}.sequence_parallel=true is not supported yet: the engine builds megatron-core's local "
                "(non-TransformerEngine) layers, whose norms refuse sequence parallelism; set it to false"
            )

    @property
    def model_parallel_size(self) -> int:
        return self.tensor_model_parallel_size * self.pipeline_model_parallel_size

    def dp_size(self, world_size: int, prefix: str) -> int:
        """world_size / (TP * PP); raises naming the keys when it does not divide."""
        if world_size % self.model_parallel_size:
            raise ValueError(
                f"{prefix}.megatron: tensor_model_parallel_size={self.tensor_model_parallel_size} x "
                f"pipeline_model_parallel_size={self.pipeline_model_parallel_size} does not divide the role's "
                f"{world_size} workers; pick sizes whose product divides it"
            )
        return world_size // self.model_parallel_size

    def check_model(self, prefix: str, num_layers: int, num_key_value_heads: int) -> None:
        """Raises naming the key when this layout cannot split a model of this shape."""
        tp, pp = self.tensor_model_parallel_size, self.pipeline_model_parallel_size
        if num_key_value_heads % tp:
            raise ValueError(
                f"{prefix}.megatron.tensor_model_parallel_size={tp} does not divide the model's "
                f"{num_key_value_heads} key/value heads (Megatron splits whole KV groups); pick a divisor"
            )
        chunks = pp * (self.virtual_pipeline_model_parallel_size or 1)
        if num_layers % chunks:
            raise ValueError(
                f"{prefix}.megatron: {num_layers} layers do not split into pipeline_model_parallel_size={pp} x "
                f"virtual_pipeline_model_parallel_size={self.virtual_pipeline_model_parallel_size} equal chunks"
            )
