"""layout.py against vLLM's per-rank tensors built independently (head by head, row by row) from full tensors."""

import pytest
import torch

from verl_like.shapes.decoder import DecoderShape, UnknownLayoutError
from verl_like.shapes.layout import (
    Placement,
    local_destination,
    param_layout,
    tp_slice,
)

# 4 query heads of dim 2, hidden 8, MLP 6, vocab 70 (padded to 128 by vLLM).
SHAPES = {
    "gqa2": DecoderShape(num_attention_heads=4, num_key_value_heads=2, head_dim=2, hidden_size=8,
                         intermediate_size=6, vocab_size=70),
    "mqa": DecoderShape(num_attention_heads=4, num_key_value_heads=1, head_dim=2, hidden_size=8,
                        intermediate_size=12, vocab_size=70),
    "mha": DecoderShape(num_attention_heads=4, num_key_value_heads=4, head_dim=2, hidden_size=8,
                        intermediate_size=12, vocab_size=70),
}


def full(rows, cols=None, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn((rows,) if cols is None else (rows, cols), generator=generator, dtype=torch.float64)


def place(layout, shape, rank, tp, tensor, target):
    """Writes tp_slice(tensor) where local_destination says (what the in-place loader does)."""
    box = tp_slice(layout, tuple(tensor.shape), shape, rank, tp)
    part = tensor[box.row_start:box.row_stop]
    if tensor.ndim == 2:
        part = part[:, box.col_start:box.col_stop]
    dest = local_destination(layout, shape, tp)
    target[dest.row_offset:dest.row_offset + part.shape[0]] = part


def reference_qkv(shape, q, k, v, rank, tp):
    """vLLM's rank-local qkv_proj: its query heads, then its kv head(s) of k, then of v (loop over heads)."""
    hd = shape.head_dim
    q_heads = shape.num_attention_heads // tp
    rows = [q[h * hd:(h + 1) * hd] for h in range(rank * q_heads, (rank + 1) * q_heads)]
    kv = shape.num_key_value_heads
    if kv >= tp:
        kv_heads = list(range(rank * (kv // tp), (rank + 1) * (kv // tp)))
    else:
        kv_heads = [rank // (tp // kv)]  # each kv head is replicated on tp // kv consecutive ranks
    for tensor in (k, v):
        rows += [tensor[h * hd:(h + 1) * hd] for h in kv_heads]
    return torch.cat(rows)


@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("kind", ["weight", "bias"])
def test_fused_qkv_slices_match_vllm_heads(name, tp, kind):
    shape = SHAPES[name]
    hd, hidden = shape.head_dim, shape.hidden_size
    cols = hidden if kind == "weight" else None
    q = full(shape.num_attention_heads * hd, cols, 1)
    k = full(shape.num_key_value_heads * hd, cols, 2)
    v = full(shape.num_key_value_heads * hd, cols, 3)
    for rank in range(tp):
        expected = reference_qkv(shape, q, k, v, rank, tp)
        got = torch.full_like(expected, float("nan"))
        for proj, tensor in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
            layout = param_layout(f"model.layers.3.self_attn.{proj}.{kind}", shape)
            assert layout.vllm_name == f"model.layers.3.self_attn.qkv_proj.{kind}"
            place(layout, shape, rank, tp, tensor, got)
        assert torch.equal(got, expected), (rank, tp)


def test_kv_heads_are_replicated_when_fewer_than_tp():
    shape = SHAPES["mqa"]
    layout = param_layout("model.layers.0.self_attn.k_proj.weight", shape)
    assert layout.placement is Placement.KV_HEADS
    boxes = {tp_slice(layout, (2, 8), shape, rank, 4) for rank in range(4)}
    assert boxes == {tp_slice(layout, (2, 8), shape, 0, 4)}  # every rank holds the single kv head


@pytest.mark.parametrize("tp", [1, 2, 3])
def test_fused_gate_up_slices(tp):
    shape = SHAPES["mha"]
    gate, up = full(12, 8, 4), full(12, 8, 5)
    per = 12 // tp
    for rank in range(tp):
        expected = torch.cat([gate[i:i + 1] for i in range(rank * per, (rank + 1) * per)]
                             + [up[i:i + 1] for i in range(rank * per, (rank + 1) * per)])
        got = torch.full_like(expected, float("nan"))
        for proj, tensor in (("gate_proj", gate), ("up_proj", up)):
            place(param_layout(f"model.layers.0.mlp.{proj}.weight", shape), shape, rank, tp, tensor, got)
        assert torch.equal(got, expected)


@pytest.mark.parametrize("name, cols", [("model.layers.1.self_attn.o_proj.weight", 8),
                                        ("model.layers.1.mlp.down_proj.weight", 12)])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_row_parallel_slices_split_the_input_dimension(name, cols, tp):
    shape = SHAPES["mha"]
    weight = full(8, cols, 6)
    layout = param_layout(name, shape)
    parts = []
    for rank in range(tp):
        box = tp_slice(layout, tuple(weight.shape), shape, rank, tp)
        assert (box.row_start, box.row_stop) == (0, 8)
        parts.append(weight[:, box.col_start:box.col_stop])
    for rank, part in enumerate(parts):
        per = cols // tp
        assert torch.equal(part, torch.stack([weight[:, c] for c in range(rank * per, (rank + 1) * per)], dim=1))


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("name", ["model.embed_tokens.weight", "lm_head.weight"])
def test_vocab_parallel_slices_follow_the_padded_vocab(tp, name):
    shape = SHAPES["gqa2"]  # vocab 70 -> 128 padded rows
    table = full(70, 8, 7)
    layout = param_layout(name, shape)
    assert layout.placement is Placement.VOCAB
    padded = torch.zeros(128, 8, dtype=torch.float64)
    padded[:70] = table
    per = 128 // tp
    for rank in range(tp):
        expected = padded[rank * per:(rank + 1) * per]
        got = torch.full_like(expected, float("nan"))
        place(layout, shape, rank, tp, table, got)
        dest = local_destination(layout, shape, tp)
        assert dest.padded_rows == per
        rows = tp_slice(layout, (70, 8), shape, rank, tp).rows
        got[rows:] = 0.0  # the loader zero-fills the padding rows
        assert torch.equal(got, expected)


def test_tied_lm_head_is_not_sent_and_norms_are_replicated():
    tied = DecoderShape(4, 2, 2, 8, 6, 70, tie_word_embeddings=True)
    assert param_layout("lm_head.weight", tied).placement is Placement.TIED
    assert param_layout("model.embed_tokens.weight", tied).placement is Placement.VOCAB
    for name in ("model.norm.weight", "model.layers.0.input_layernorm.weight",
                 "model.layers.0.post_attention_layernorm.weight", "model.layers.0.self_attn.o_proj.bias"):
        layout = param_layout(name, tied)
        assert layout.placement is Placement.REPLICATED
        assert tp_slice(layout, (8,), tied, 1, 2).rows == 8


def test_shape_from_hf_config_and_unsupported_cases():
    from transformers import Qwen2Config

    config = Qwen2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                         vocab_size=100, tie_word_embeddings=True)
    shape = DecoderShape.from_hf_config(config)
    assert (shape.head_dim, shape.num_key_value_heads, shape.tie_word_embeddings) == (16, 2, True)
    with pytest.raises(UnknownLayoutError, match="does not know HF parameter 'model.layers.0.mlp.experts.w1'"):
        param_layout("model.layers.0.mlp.experts.w1", shape)
    with pytest.raises(UnknownLayoutError, match="num_attention_heads=4"):
        shape.check_tp(3)
