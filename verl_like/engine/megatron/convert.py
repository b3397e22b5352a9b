"""HF <-> Megatron-core weights for the Qwen2 and Llama families (pure tensors, no process group).

Megatron's GPTModel with the local (non-TransformerEngine) layer spec names a decoder layer's weights
`decoder.layers.{i}.{input_layernorm, self_attention.linear_qkv, self_attention.linear_proj, pre_mlp_layernorm,
mlp.linear_fc1, mlp.linear_fc2}` (i counts the layers of one model chunk from 0), plus `embedding.word_embeddings`,
`decoder.final_layernorm` and `output_layer`. Tensor-parallel layouts on TP rank r of t:
  linear_qkv (weight, bias): the KV groups of rank r, each `[its q heads | k | v]` rows (TP splits whole groups);
  linear_fc1: `[gate_r; up_r]` (row chunks r of gate_proj and up_proj);
  linear_proj, linear_fc2: column chunk r of o_proj / down_proj;
  word_embeddings, output_layer: row chunk r of the vocabulary padded to a multiple of t (padding rows are 0 and
    belong to no HF tensor).
Norms are replicated. Pipeline stage p (of pp, with vpp model chunks each) holds global layers
`chunk * L/vpp + p * L/(pp*vpp) + [0, L/(pp*vpp))` for each of its chunks (Megatron's even split).

The HF side is the HF (unfused) layout: the pieces of a rank are rectangles (`shapes.layout.Box`) of the full
HF tensors, listed by `hf_boxes`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from verl_like.shapes.decoder import DecoderShape
from verl_like.shapes.layout import Box

SUPPORTED_MODEL_TYPES = ("qwen2", "llama")

# One decoder layer's names, HF (under `model.layers.{i}.`) -> Megatron (under `decoder.layers.{local i}.`): the
# tensors that map one to one, then the fused ones (Megatron's one tensor from several HF tensors, in this order).
LAYER_NAMES = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attn.o_proj.weight": "self_attention.linear_proj.weight",
    "post_attention_layernorm.weight": "pre_mlp_layernorm.weight",
    "mlp.down_proj.weight": "mlp.linear_fc2.weight",
}
QKV = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")  # + ".weight" / ".bias"
QKV_MEGATRON = "self_attention.linear_qkv"  # + ".weight" / ".bias": `[q of g | k_g | v_g]` per KV group
FC1_MEGATRON, FC1 = "mlp.linear_fc1.weight", ("mlp.gate_proj.weight", "mlp.up_proj.weight")  # `[gate; up]`


def model_shape(hf_config: Any, value_head: bool = False) -> DecoderShape:
    """The DecoderShape of a HF Qwen2 / Llama config; raises for other families."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"the Megatron engine converts only {SUPPORTED_MODEL_TYPES} models, got model_type={model_type!r}; "
            "use strategy=fsdp2 for this model"
        )
    if model_type == "llama" and (getattr(hf_config, "attention_bias", False) or getattr(hf_config, "mlp_bias", False)):
        # Llama's attention_bias also puts a bias on o_proj, which the local layer spec has no place for.
        raise ValueError(
            "the Megatron converter supports Llama models without attention_bias / mlp_bias; use strategy=fsdp2"
        )
    qkv_bias = model_type == "qwen2"
    tied = bool(getattr(hf_config, "tie_word_embeddings", False)) and not value_head
    shape = DecoderShape.from_hf_config(hf_config, text_config=False)
    return dataclasses.replace(shape, tie_word_embeddings=tied, qkv_bias=qkv_bias, value_head=value_head)


def chunk_layers(num_layers: int, pp: int, pp_rank: int, vpp: int | None = None, vp_stage: int = 0) -> range:
    """Global layer indices held by model chunk `vp_stage` of pipeline stage `pp_rank`."""
    chunks = vpp or 1
    per_chunk = num_layers // (pp * chunks)
    start = vp_stage * (num_layers // chunks) + pp_rank * per_chunk
    return range(start, start + per_chunk)


def _layer_boxes(shape: DecoderShape, layer: int, tp_rank: int, tp: int) -> dict[str, Box]:
    """HF name -> the box TP rank `tp_rank` holds, for one decoder layer's parameters."""
    prefix = f"model.layers.{layer}."
    groups = shape.num_key_value_heads // tp
    q_rows = groups * shape.heads_per_group * shape.head_dim
    kv_rows = groups * shape.head_dim
    ffn = shape.intermediate_size // tp
    hidden_cols = shape.num_attention_heads * shape.head_dim // tp
    boxes = {
        prefix + "self_attn.q_proj.weight": Box(tp_rank * q_rows, (tp_rank + 1) * q_rows),
        prefix + "self_attn.k_proj.weight": Box(tp_rank * kv_rows, (tp_rank + 1) * kv_rows),
        prefix + "self_attn.v_proj.weight": Box(tp_rank * kv_rows, (tp_rank + 1) * kv_rows),
        prefix + "self_attn.o_proj.weight": Box(0, shape.hidden_size, tp_rank * hidden_cols,
                                                (tp_rank + 1) * hidden_cols),
        prefix + "mlp.gate_proj.weight": Box(tp_rank * ffn, (tp_rank + 1) * ffn),
        prefix + "mlp.up_proj.weight": Box(tp_rank * ffn, (tp_rank + 1) * ffn),
        prefix + "mlp.down_proj.weight": Box(0, shape.hidden_size, tp_rank * ffn, (tp_rank + 1) * ffn),
        prefix + "input_layernorm.weight": Box(0, shape.hidden_size),
        prefix + "post_attention_layernorm.weight": Box(0, shape.hidden_size),
    }
    if shape.qkv_bias:
        for name in ("q_proj", "k_proj", "v_proj"):
            weight_box = boxes[prefix + f"self_attn.{name}.weight"]
            boxes[prefix + f"self_attn.{name}.bias"] = Box(weight_box.row_start, weight_box.row_stop)
    return boxes


def _vocab_box(shape: DecoderShape, tp_rank: int, tp: int) -> Box:
    rows = shape.padded_vocab(tp) // tp
    start = min(tp_rank * rows, shape.vocab_size)
    return Box(start, min((tp_rank + 1) * rows, shape.vocab_size))


def hf_boxes(
    shape: DecoderShape, tp_rank: int, tp: int, pp_rank: int, pp: int, vpp: int | None = None
) -> dict[str, Box]:
    """HF name -> the box of it this (tp_rank, pp_rank) holds, over all its model chunks (tied lm_head omitted)."""
    boxes: dict[str, Box] = {}
    if pp_rank == 0:
        boxes["model.embed_tokens.weight"] = _vocab_box(shape, tp_rank, tp)
    for vp_stage in range(vpp or 1):
        for layer in chunk_layers(shape.num_hidden_layers, pp, pp_rank, vpp, vp_stage):
            boxes.update(_layer_boxes(shape, layer, tp_rank, tp))
    if pp_rank == pp - 1:
        boxes["model.norm.weight"] = Box(0, shape.hidden_size)
        if shape.value_head:
            boxes["score.weight"] = Box(0, 1)
            boxes["score.bias"] = Box(0, 1)
        elif not shape.tie_word_embeddings:
            boxes["lm_head.weight"] = _vocab_box(shape, tp_rank, tp)
    return boxes


def _cut(tensor: torch.Tensor, box: Box) -> torch.Tensor:
    if tensor.ndim == 1:
        return tensor[box.row_start:box.row_stop]
    return tensor[box.row_start:box.row_stop, box.col_start:box.col_stop]


def _qkv(shape: DecoderShape, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Megatron's interleaved `[q of g | k_g | v_g]` per KV group from this rank's HF q, k, v rows."""
    groups = k.shape[0] // shape.head_dim
    rest = q.shape[1:]
    q = q.reshape(groups, shape.heads_per_group * shape.head_dim, *rest)
    k = k.reshape(groups, shape.head_dim, *rest)
    v = v.reshape(groups, shape.head_dim, *rest)
    return torch.cat([q, k, v], dim=1).reshape(-1, *rest)


def _split_qkv(shape: DecoderShape, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rest = qkv.shape[1:]
    q_rows = shape.heads_per_group * shape.head_dim
    grouped = qkv.reshape(-1, q_rows + 2 * shape.head_dim, *rest)
    q, k, v = grouped.split([q_rows, shape.head_dim, shape.head_dim], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def _padded_vocab_rows(shape: DecoderShape, full: torch.Tensor, tp_rank: int, tp: int) -> torch.Tensor:
    rows = shape.padded_vocab(tp) // tp
    out = full.new_zeros((rows, full.shape[1]))
    box = _vocab_box(shape, tp_rank, tp)
    out[: box.rows] = _cut(full, box)
    return out


def hf_to_megatron(
    shape: DecoderShape,
    hf_state: dict[str, torch.Tensor],
    tp_rank: int,
    tp: int,
    pp_rank: int,
    pp: int,
    vpp: int | None = None,
    vp_stage: int = 0,
) -> dict[str, torch.Tensor]:
    """The Megatron parameters of one model chunk on (tp_rank, pp_rank), from a full HF state dict."""
    out: dict[str, torch.Tensor] = {}
    first_chunk = pp_rank == 0 and vp_stage == 0
    last_chunk = pp_rank == pp - 1 and vp_stage == (vpp or 1) - 1
    if first_chunk:
        out["embedding.word_embeddings.weight"] = _padded_vocab_rows(
            shape, hf_state["model.embed_tokens.weight"], tp_rank, tp)
    for local, layer in enumerate(chunk_layers(shape.num_hidden_layers, pp, pp_rank, vpp, vp_stage)):
        boxes = _layer_boxes(shape, layer, tp_rank, tp)
        hf = f"model.layers.{layer}."
        mg = f"decoder.layers.{local}."

        def piece(name: str) -> torch.Tensor:
            return _cut(hf_state[hf + name], boxes[hf + name])  # noqa: B023 - used inside this iteration only

        for hf_name, mg_name in LAYER_NAMES.items():
            out[mg + mg_name] = piece(hf_name)
        for kind in ("weight", "bias") if shape.qkv_bias else ("weight",):
            out[mg + f"{QKV_MEGATRON}.{kind}"] = _qkv(shape, *(piece(f"{name}.{kind}") for name in QKV))
        out[mg + FC1_MEGATRON] = torch.cat([piece(name) for name in FC1])
    if last_chunk:
        out["decoder.final_layernorm.weight"] = hf_state["model.norm.weight"]
        if shape.value_head:
            out["output_layer.weight"] = hf_state["score.weight"]
            out["output_layer.bias"] = hf_state["score.bias"]
        elif not shape.tie_word_embeddings:
            out["output_layer.weight"] = _padded_vocab_rows(shape, hf_state["lm_head.weight"], tp_rank, tp)
        elif not first_chunk:  # the last stage's copy of the tied embedding
            out["output_layer.weight"] = _padded_vocab_rows(shape, hf_state["model.embed_tokens.weight"], tp_rank, tp)
    return {name: tensor.clone() for name, tensor in out.items()}


def megatron_to_hf(
    shape: DecoderShape,
    mg_state: dict[str, torch.Tensor],
    tp_rank: int,
    tp: int,
    pp_rank: int,
    pp: int,
    vpp: int | None = None,
    vp_stage: int = 0,
) -> dict[str, torch.Tensor]:
    """HF name -> this rank's piece (its `hf_boxes` rectangle) from one model chunk's Megatron parameters.

    The last stage's copy of a tied embedding is not returned (HF has no lm_head then).
    """
    out: dict[str, torch.Tensor] = {}
    if "embedding.word_embeddings.weight" in mg_state:
        rows = _vocab_box(shape, tp_rank, tp).rows
        out["model.embed_tokens.weight"] = mg_state["embedding.word_embeddings.weight"][:rows]
    for local, layer in enumerate(chunk_layers(shape.num_hidden_layers, pp, pp_rank, vpp, vp_stage)):
        hf = f"model.layers.{layer}."
        mg = f"decoder.layers.{local}."
        for kind in ("weight", "bias") if shape.qkv_bias else ("weight",):
            for name, part in zip(QKV, _split_qkv(shape, mg_state[mg + f"{QKV_MEGATRON}.{kind}"])):
                out[hf + f"{name}.{kind}"] = part
        for name, part in zip(FC1, mg_state[mg + FC1_MEGATRON].chunk(len(FC1))):
            out[hf + name] = part
        for hf_name, mg_name in LAYER_NAMES.items():
            out[hf + hf_name] = mg_state[mg + mg_name]
    if "decoder.final_layernorm.weight" in mg_state:
        out["model.norm.weight"] = mg_state["decoder.final_layernorm.weight"]
        if shape.value_head:
            out["score.weight"] = mg_state["output_layer.weight"]
            out["score.bias"] = mg_state["output_layer.bias"]
        elif not shape.tie_word_embeddings:
            rows = _vocab_box(shape, tp_rank, tp).rows
            out["lm_head.weight"] = mg_state["output_layer.weight"][:rows]
    return out


def assemble(full_shape: tuple[int, ...], pieces: list[tuple[Box, torch.Tensor]]) -> torch.Tensor:
    """The full tensor from (box, piece) pairs that cover it (replicated boxes overwrite with equal values)."""
    full = pieces[0][1].new_zeros(full_shape)
    for box, piece in pieces:
        if full.ndim == 1:
            full[box.row_start:box.row_stop] = piece
        else:
            full[box.row_start:box.row_stop, box.col_start:box.col_stop] = piece
    return full


def rope_theta(hf_config: Any) -> float:
    """The RoPE base of a HF config (transformers 5 keeps it under `rope_parameters`); raises for scaled RoPE."""
    parameters = getattr(hf_config, "rope_parameters", None) or {}
    scaling = getattr(hf_config, "rope_scaling", None) or {}
    rope_type = parameters.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type != "default":
        raise ValueError(
            f"the Megatron engine supports plain RoPE only, the model uses rope_type={rope_type!r}; use "
            "strategy=fsdp2 for this model"
        )
    theta = parameters.get("rope_theta", getattr(hf_config, "rope_theta", None))
    if theta is None:
        raise ValueError("the HF config names no rope_theta (neither rope_parameters['rope_theta'] nor rope_theta)")
    return float(theta)


def transformer_config(hf_config: Any, shape: DecoderShape, parallel: Any, dtype: torch.dtype) -> Any:
    """Megatron's TransformerConfig for this model and layout (`parallel`: a config.megatron.MegatronConfig).

    No fusions (they need CUDA kernels or TransformerEngine), no dropout, variable micro-batch shapes (except
    under the interleaved schedule), per-token-loss mode (neither the schedule nor DDP divides the
    loss: our loss contract normalises).
    """
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(
        num_layers=shape.num_hidden_layers,
        hidden_size=shape.hidden_size,
        num_attention_heads=shape.num_attention_heads,
        num_query_groups=shape.num_key_value_heads,
        kv_channels=shape.head_dim,
        ffn_hidden_size=shape.intermediate_size,
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=shape.qkv_bias,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=parallel.tensor_model_parallel_size,
        pipeline_model_parallel_size=parallel.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=parallel.virtual_pipeline_model_parallel_size,
        sequence_parallel=parallel.sequence_parallel,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        # Plain 1F1B sends each micro-batch's shape first; the interleaved schedule of 0.16.1 deadlocks with that,
        # so there every micro-batch is padded to one shape (engine._run_schedule).
        variable_seq_lengths=parallel.virtual_pipeline_model_parallel_size is None,
        moe_token_dispatcher_type="alltoall",  # no MoE here; the default (allgather) refuses variable lengths
        calculate_per_token_loss=True,
        # The random init is overwritten by the loaded weights, but 0.16.1 marks the TP-split parameters
        # (`tensor_model_parallel`, which the grad norm relies on) only inside its initialisers: keep it on.
        perform_initialization=True,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
    )
