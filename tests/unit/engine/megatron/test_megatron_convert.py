"""HF <-> Megatron weight conversion (verl_like.engine.megatron.convert): pure tensors, no process group."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen2ForTokenClassification

from verl_like.engine.megatron.convert import (
    assemble,
    chunk_layers,
    hf_boxes,
    hf_to_megatron,
    megatron_to_hf,
    model_shape,
    rope_theta,
)

_COMMON = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
               num_hidden_layers=4, vocab_size=37, max_position_embeddings=64)


def _model(family: str, tied: bool, value: bool = False):
    torch.manual_seed(0)
    if family == "qwen2":
        config = Qwen2Config(tie_word_embeddings=tied, **_COMMON)
        if value:
            config.num_labels = 1
            return Qwen2ForTokenClassification(config)
        return Qwen2ForCausalLM(config)
    return LlamaForCausalLM(LlamaConfig(tie_word_embeddings=tied, **_COMMON))


def _round_trip(model, tp: int, pp: int, vpp: int | None, value: bool = False) -> dict[str, torch.Tensor]:
    shape = model_shape(model.config, value_head=value)
    hf_state = dict(model.state_dict())
    pieces: dict[str, list] = {}
    for tp_rank in range(tp):
        for pp_rank in range(pp):
            boxes = hf_boxes(shape, tp_rank, tp, pp_rank, pp, vpp)
            returned = {}
            for vp_stage in range(vpp or 1):
                mg = hf_to_megatron(shape, hf_state, tp_rank, tp, pp_rank, pp, vpp, vp_stage)
                returned.update(megatron_to_hf(shape, mg, tp_rank, tp, pp_rank, pp, vpp, vp_stage))
            assert set(returned) == set(boxes)
            for name, piece in returned.items():
                assert tuple(piece.shape) == boxes[name].shape(tuple(hf_state[name].shape)), name
                pieces.setdefault(name, []).append((boxes[name], piece))
    return {name: assemble(tuple(hf_state[name].shape), parts) for name, parts in pieces.items()}


@pytest.mark.parametrize("family", ["qwen2", "llama"])
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize(("tp", "pp", "vpp"), [(1, 1, None), (2, 1, None), (1, 2, None), (2, 2, None), (1, 2, 2)])
def test_hf_megatron_round_trip_is_exact(family, tied, tp, pp, vpp):
    model = _model(family, tied)
    rebuilt = _round_trip(model, tp, pp, vpp)
    expected = {name: p.detach() for name, p in model.named_parameters()}  # tied lm_head is not a parameter
    assert list(rebuilt) != [] and set(rebuilt) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(rebuilt[name], tensor), name


def test_value_head_round_trip_is_exact():
    model = _model("qwen2", tied=False, value=True)
    rebuilt = _round_trip(model, 2, 2, None, value=True)
    for name, tensor in model.named_parameters():
        assert torch.equal(rebuilt[name], tensor.detach()), name


def test_qkv_rows_are_grouped_per_kv_head_and_split_by_tp():
    """Megatron's linear_qkv on TP rank r: for each KV group of r, its q heads, then k, then v (checked row by row)."""
    model = _model("qwen2", tied=False)
    shape = model_shape(model.config)
    state = model.state_dict()
    q, k, v = (state[f"model.layers.0.self_attn.{n}_proj.weight"] for n in "qkv")
    hd, per_group = shape.head_dim, shape.heads_per_group
    for tp_rank in range(2):
        mg = hf_to_megatron(shape, state, tp_rank, 2, 0, 1)["decoder.layers.0.self_attention.linear_qkv.weight"]
        group = tp_rank  # 2 KV groups over 2 TP ranks: one each
        expected = torch.cat([q[group * per_group * hd:(group + 1) * per_group * hd], k[group * hd:(group + 1) * hd],
                              v[group * hd:(group + 1) * hd]])
        assert torch.equal(mg, expected)


def test_fc1_is_gate_then_up_and_vocab_padding_rows_are_zero():
    model = _model("qwen2", tied=False)
    shape = model_shape(model.config)
    state = model.state_dict()
    mg = hf_to_megatron(shape, state, 1, 2, 0, 1)
    ffn = shape.intermediate_size // 2
    gate, up = state["model.layers.0.mlp.gate_proj.weight"], state["model.layers.0.mlp.up_proj.weight"]
    assert torch.equal(mg["decoder.layers.0.mlp.linear_fc1.weight"], torch.cat([gate[ffn:], up[ffn:]]))
    # vocab 37 padded as vLLM pads it (to 64) over TP=2: rank 1 holds rows 32..36 and 27 zero padding rows, the
    # rows vLLM's TP rank 1 holds.
    embedding = mg["embedding.word_embeddings.weight"]
    assert embedding.shape == (32, 64)
    assert torch.equal(embedding[:5], state["model.embed_tokens.weight"][32:])
    assert not embedding[5:].any()
    box = hf_boxes(shape, 1, 2, 0, 1)["model.embed_tokens.weight"]
    assert (box.row_start, box.row_stop) == (32, 37)


def test_tied_embedding_goes_to_the_last_stage_output_layer():
    model = _model("qwen2", tied=True)
    shape = model_shape(model.config)
    last = hf_to_megatron(shape, model.state_dict(), 0, 1, 1, 2)
    embed = model.state_dict()["model.embed_tokens.weight"]
    assert torch.equal(last["output_layer.weight"][: embed.shape[0]], embed)
    assert not last["output_layer.weight"][embed.shape[0]:].any()  # vLLM-style padding rows
    assert "output_layer.weight" not in hf_to_megatron(shape, model.state_dict(), 0, 1, 0, 1)
    assert "lm_head.weight" not in hf_boxes(shape, 0, 1, 1, 2)


def test_interleaved_chunks_hold_megatron_layer_offsets():
    assert [list(chunk_layers(8, 2, p, 2, c)) for p in range(2) for c in range(2)] == [
        [0, 1], [4, 5], [2, 3], [6, 7]]


def test_unsupported_models_are_refused_with_the_fix():
    config = Qwen2Config(**_COMMON)
    config.model_type = "mistral"
    with pytest.raises(ValueError, match="strategy=fsdp2"):
        model_shape(config)
    with pytest.raises(ValueError, match="attention_bias"):
        model_shape(LlamaConfig(attention_bias=True, **_COMMON))
    scaled = LlamaConfig(rope_scaling={"rope_type": "linear", "factor": 2.0}, **_COMMON)
    with pytest.raises(ValueError, match="rope_type='linear'"):
        rope_theta(scaled)
    assert rope_theta(Qwen2Config(**_COMMON)) == 10000.0
