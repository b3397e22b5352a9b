"""`DecoderShape`: the sizes of a Qwen2/Llama-style decoder, the one shape class every module reads.

The vLLM TP layout (shapes/layout.py), the HF <-> Megatron converter (engine/megatron/convert.py) and the FLOP
count (utils/flops.py) each need a few of these sizes; they share one frozen value under the HF config's names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

VOCAB_PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE, used by Qwen2 and Llama

_POSITIVE = ("num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size", "intermediate_size",
             "vocab_size", "num_hidden_layers")


class UnknownLayoutError(ValueError):
    """A parameter (or model shape) the slice plan does not know; the full-tensor path still works for it."""


@dataclass(frozen=True)
class DecoderShape:
    """A decoder's sizes, named as in its HF config.

    qkv_bias: q/k/v projections carry biases (Qwen2); value_head: a Linear(hidden, 1) `score` head replaces the
    LM head (a critic); vocab_padding: the multiple vLLM pads the vocabulary to.
    """

    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    num_hidden_layers: int = 1
    qkv_bias: bool = False
    value_head: bool = False
    vocab_padding: int = VOCAB_PADDING

    def __post_init__(self) -> None:
        for name in _POSITIVE:
            if getattr(self, name) < 1:
                raise ValueError(f"DecoderShape.{name}={getattr(self, name)} must be >= 1")

    @classmethod
    def from_hf_config(cls, config: Any, text_config: bool = True) -> DecoderShape:
        """Reads a transformers config (Qwen2Config, LlamaConfig, ...); with `text_config` a vision-language
        model's text config (the FLOP count reads only the top level, so a VLM gets none)."""
        text = config.get_text_config() if text_config and hasattr(config, "get_text_config") else config
        heads = text.num_attention_heads
        return cls(
            num_attention_heads=heads,
            num_key_value_heads=getattr(text, "num_key_value_heads", None) or heads,
            head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
            hidden_size=text.hidden_size,
            intermediate_size=text.intermediate_size,
            vocab_size=text.vocab_size,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            num_hidden_layers=text.num_hidden_layers,
        )

    @property
    def heads_per_group(self) -> int:
        """Query heads per KV head (grouped-query attention)."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def linear_params_per_layer(self) -> int:
        """Weights of one decoder layer's linear maps: q, k, v, o projections and the gated MLP."""
        h, d = self.hidden_size, self.head_dim
        q, kv = self.num_attention_heads * d, self.num_key_value_heads * d
        return h * q + 2 * h * kv + q * h + 3 * h * self.intermediate_size

    def check_tp(self, tp_size: int) -> None:
        """Raises UnknownLayoutError when vLLM could not split this model over `tp_size` ranks this way."""
        problems = []
        if self.num_attention_heads % tp_size:
            problems.append(f"num_attention_heads={self.num_attention_heads}")
        if self.intermediate_size % tp_size:
            problems.append(f"intermediate_size={self.intermediate_size}")
        kv = self.num_key_value_heads
        if (kv >= tp_size and kv % tp_size) or (kv < tp_size and tp_size % kv):
            problems.append(f"num_key_value_heads={kv}")
        if problems:
            raise UnknownLayoutError(
                f"tensor_model_parallel_size={tp_size} does not split {', '.join(problems)} evenly; choose a TP "
                "size that divides the attention heads and the MLP width (and divides or is a multiple of the "
                "kv heads)"
            )

    def kv_heads_per_rank(self, tp_size: int) -> int:
        return max(1, self.num_key_value_heads // tp_size)

    def padded_vocab_per_rank(self, tp_size: int) -> int:
        """Embedding rows of one vLLM TP rank: the vocab padded to `vocab_padding`, split evenly."""
        padded = -(-self.vocab_size // self.vocab_padding) * self.vocab_padding
        if padded % tp_size:
            raise UnknownLayoutError(
                f"the padded vocab ({padded} rows) does not split over tensor_model_parallel_size={tp_size}"
            )
        return padded // tp_size

    def padded_vocab(self, tp: int) -> int:
        """Megatron's vocabulary, rounded up to a multiple of lcm(64, tp): Megatron splits whole rows over TP, and
        padding as vLLM pads (64) makes a Megatron TP rank hold exactly the embedding rows vLLM's same TP rank needs."""
        step = math.lcm(self.vocab_padding, tp)
        return -(-self.vocab_size // step) * step
