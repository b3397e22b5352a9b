"""The HF <-> vLLM parameter layout of Qwen2/Llama-style decoder models under vLLM tensor parallelism.

The one place that knows, for each HF parameter, how vLLM splits it over TP ranks and where the rank's piece
sits inside vLLM's (possibly fused) parameter:

  q_proj / k_proj / v_proj (weight, bias)  -> qkv_proj, column-parallel by attention heads. With GQA, k/v heads
      are split over TP as well; when num_key_value_heads < tp each kv head is replicated on tp / kv_heads
      consecutive ranks (rank r holds kv head r // replicas).
  gate_proj / up_proj                      -> gate_up_proj, column-parallel (dim 0, tp equal parts each).
  o_proj / down_proj weight                -> row-parallel (dim 1); their biases are replicated.
  embed_tokens / lm_head                   -> vocab-parallel: vLLM pads the vocab to a multiple of 64, splits the
      padded rows evenly, and zero-fills the rows past the real vocab; lm_head is not sent at all when the
      embeddings are tied (vLLM's lm_head is the embedding).
  norms                                    -> replicated.

`tp_slice` gives the rectangle of the FULL HF tensor that TP rank r needs; `local_destination` says where that
rectangle goes inside rank r's vLLM parameter. Both are pure functions of the model's shape.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from verl_like.shapes.decoder import DecoderShape, UnknownLayoutError


class Placement(enum.Enum):
    """How vLLM splits one HF parameter over TP ranks."""

    Q_HEADS = "q_heads"
    KV_HEADS = "kv_heads"
    COLUMN = "column"
    ROW = "row"
    VOCAB = "vocab"
    REPLICATED = "replicated"
    TIED = "tied"  # lm_head of a model with tied embeddings: vLLM reads it from embed_tokens


@dataclass(frozen=True)
class ParamLayout:
    """Where one HF parameter lives in vLLM.

    vllm_name: vLLM's parameter name (fused names for q/k/v and gate/up).
    fused_shard: the part of the fused parameter this HF tensor fills ("q", "k", "v", 0 for gate, 1 for up).
    """

    hf_name: str
    placement: Placement
    vllm_name: str
    fused_shard: str | int | None = None


@dataclass(frozen=True)
class ParamSpec:
    """One parameter to sync: HF name, full shape, its vLLM layout, bytes per element on the wire."""

    name: str
    shape: tuple[int, ...]
    layout: ParamLayout
    element_size: int

    @property
    def row_bytes(self) -> int:
        return (self.shape[1] if len(self.shape) == 2 else 1) * self.element_size

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.row_bytes


@dataclass(frozen=True)
class Box:
    """A rectangle of a full tensor: rows [row_start, row_stop) of dim 0 and, for 2-D tensors, columns
    [col_start, col_stop) of dim 1 (col_stop None: every column)."""

    row_start: int
    row_stop: int
    col_start: int = 0
    col_stop: int | None = None

    @property
    def rows(self) -> int:
        return max(0, self.row_stop - self.row_start)

    def cols(self, full_cols: int) -> int:
        stop = full_cols if self.col_stop is None else self.col_stop
        return max(0, stop - self.col_start)

    def numel(self, full_shape: tuple[int, ...]) -> int:
        return self.rows * (self.cols(full_shape[1]) if len(full_shape) == 2 else 1)

    def shape(self, full_shape: tuple[int, ...]) -> tuple[int, ...]:
        return (self.rows, self.cols(full_shape[1])) if len(full_shape) == 2 else (self.rows,)

    def intersect(self, other: "Box", full_cols: int) -> "Box | None":
        """The rectangle both boxes cover (columns resolved against `full_cols` for 1-D tensors: 1); None if empty."""
        rows_lo, rows_hi = max(self.row_start, other.row_start), min(self.row_stop, other.row_stop)
        cols_lo = max(self.col_start, other.col_start)
        cols_hi = min(full_cols if self.col_stop is None else self.col_stop,
                      full_cols if other.col_stop is None else other.col_stop)
        if rows_lo >= rows_hi or cols_lo >= cols_hi:
            return None
        return Box(rows_lo, rows_hi, cols_lo, None if cols_hi == full_cols else cols_hi)

    def intersect_rows(self, start: int, stop: int) -> "Box | None":
        """This box restricted to rows [start, stop); None when nothing is left."""
        lo, hi = max(self.row_start, start), min(self.row_stop, stop)
        if lo >= hi:
            return None
        return Box(lo, hi, self.col_start, self.col_stop)


_LAYER = r"^(?P<prefix>.*\.layers\.\d+)\."
_RULES: tuple[tuple[re.Pattern, Placement, str, str | int | None], ...] = (
    (re.compile(_LAYER + r"self_attn\.q_proj\.(?P<kind>weight|bias)$"), Placement.Q_HEADS, "self_attn.qkv_proj", "q"),
    (re.compile(_LAYER + r"self_attn\.k_proj\.(?P<kind>weight|bias)$"), Placement.KV_HEADS, "self_attn.qkv_proj", "k"),
    (re.compile(_LAYER + r"self_attn\.v_proj\.(?P<kind>weight|bias)$"), Placement.KV_HEADS, "self_attn.qkv_proj", "v"),
    (re.compile(_LAYER + r"self_attn\.o_proj\.(?P<kind>weight)$"), Placement.ROW, "self_attn.o_proj", None),
    (re.compile(_LAYER + r"self_attn\.o_proj\.(?P<kind>bias)$"), Placement.REPLICATED, "self_attn.o_proj", None),
    (re.compile(_LAYER + r"mlp\.gate_proj\.(?P<kind>weight|bias)$"), Placement.COLUMN, "mlp.gate_up_proj", 0),
    (re.compile(_LAYER + r"mlp\.up_proj\.(?P<kind>weight|bias)$"), Placement.COLUMN, "mlp.gate_up_proj", 1),
    (re.compile(_LAYER + r"mlp\.down_proj\.(?P<kind>weight)$"), Placement.ROW, "mlp.down_proj", None),
    (re.compile(_LAYER + r"mlp\.down_proj\.(?P<kind>bias)$"), Placement.REPLICATED, "mlp.down_proj", None),
    (re.compile(_LAYER + r"(?P<norm>input_layernorm|post_attention_layernorm)\.(?P<kind>weight)$"),
     Placement.REPLICATED, "", None),
)
_GLOBAL = {
    "model.embed_tokens.weight": Placement.VOCAB,
    "model.norm.weight": Placement.REPLICATED,
    "lm_head.weight": Placement.VOCAB,
}


def param_layout(hf_name: str, shape: DecoderShape) -> ParamLayout:
    """The vLLM layout of HF parameter `hf_name`; UnknownLayoutError for names outside Qwen2/Llama."""
    if hf_name in _GLOBAL:
        placement = _GLOBAL[hf_name]
        if hf_name == "lm_head.weight" and shape.tie_word_embeddings:
            placement = Placement.TIED
        return ParamLayout(hf_name, placement, hf_name)
    for pattern, placement, module, shard in _RULES:
        match = pattern.match(hf_name)
        if match:
            if not module:  # norms keep their own name
                return ParamLayout(hf_name, placement, hf_name)
            return ParamLayout(hf_name, placement, f"{match['prefix']}.{module}.{match['kind']}", shard)
    raise UnknownLayoutError(
        f"the slice plan does not know HF parameter {hf_name!r} (it covers Qwen2/Llama-style decoders); "
        "use rollout.weight_sync_mode='full'"
    )


def _expected_rows(layout: ParamLayout, shape: DecoderShape) -> int | None:
    placement = layout.placement
    if placement is Placement.Q_HEADS:
        return shape.num_attention_heads * shape.head_dim
    if placement is Placement.KV_HEADS:
        return shape.num_key_value_heads * shape.head_dim
    if placement is Placement.COLUMN:
        return shape.intermediate_size
    if placement is Placement.VOCAB:
        return shape.vocab_size
    return None


def check_full_shape(layout: ParamLayout, full_shape: tuple[int, ...], shape: DecoderShape) -> None:
    """Raises UnknownLayoutError when the HF tensor's shape does not match what the layout assumes."""
    expected = _expected_rows(layout, shape)
    bad = expected is not None and full_shape[0] != expected
    if layout.placement is Placement.ROW and len(full_shape) != 2:
        bad = True
    if bad:
        raise UnknownLayoutError(
            f"{layout.hf_name} has shape {tuple(full_shape)}, but the model config implies "
            f"{expected} rows for a {layout.placement.value} parameter"
        )


def tp_slice(
    layout: ParamLayout, full_shape: tuple[int, ...], shape: DecoderShape, tp_rank: int, tp_size: int
) -> Box:
    """The rectangle of the full HF tensor that vLLM's TP rank `tp_rank` of `tp_size` holds."""
    if not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank={tp_rank} is outside [0, tp_size={tp_size})")
    rows = full_shape[0]
    placement = layout.placement
    if placement in (Placement.REPLICATED, Placement.TIED):
        return Box(0, rows)
    if placement is Placement.Q_HEADS:
        per = shape.num_attention_heads // tp_size * shape.head_dim
        return Box(tp_rank * per, (tp_rank + 1) * per)
    if placement is Placement.KV_HEADS:
        heads = shape.kv_heads_per_rank(tp_size)
        replicas = max(1, tp_size // shape.num_key_value_heads)
        index = tp_rank // replicas
        per = heads * shape.head_dim
        return Box(index * per, (index + 1) * per)
    if placement is Placement.COLUMN:
        per = rows // tp_size
        return Box(tp_rank * per, (tp_rank + 1) * per)
    if placement is Placement.ROW:
        per = full_shape[1] // tp_size
        return Box(0, rows, tp_rank * per, (tp_rank + 1) * per)
    if placement is Placement.VOCAB:
        per = shape.padded_vocab_per_rank(tp_size)
        start = min(tp_rank * per, shape.vocab_size)
        return Box(start, min((tp_rank + 1) * per, shape.vocab_size))
    raise AssertionError(placement)


@dataclass(frozen=True)
class LocalDestination:
    """Where a TP slice goes in the rank's vLLM parameter: rows [row_offset, row_offset + slice rows), and
    for vocab-parallel parameters the rows after the slice up to `padded_rows` are zero."""

    row_offset: int = 0
    padded_rows: int | None = None


def fused_shard_rows(layout: ParamLayout, shape: DecoderShape, tp_size: int) -> dict[str | int, int]:
    """Rows of each part of the rank-local fused parameter, in vLLM's order (q, k, v or gate, up)."""
    if layout.fused_shard in ("q", "k", "v"):
        kv = shape.kv_heads_per_rank(tp_size) * shape.head_dim
        return {"q": shape.num_attention_heads // tp_size * shape.head_dim, "k": kv, "v": kv}
    if layout.fused_shard in (0, 1):
        per = shape.intermediate_size // tp_size
        return {0: per, 1: per}
    return {}


def local_destination(layout: ParamLayout, shape: DecoderShape, tp_size: int) -> LocalDestination:
    """Where `tp_slice(...)` lands inside TP rank's vLLM parameter (the same for every rank)."""
    if layout.placement is Placement.VOCAB:
        return LocalDestination(0, shape.padded_vocab_per_rank(tp_size))
    parts = fused_shard_rows(layout, shape, tp_size)
    offset = 0
    for shard, rows in parts.items():
        if shard == layout.fused_shard:
            return LocalDestination(offset)
        offset += rows
    return LocalDestination(0)
