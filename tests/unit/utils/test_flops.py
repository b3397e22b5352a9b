"""FLOP counts against a hand count for a tiny Qwen2 shape, and the linear parameter count against a real model."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from verl_like.shapes.decoder import DecoderShape
from verl_like.utils.flops import (
    DEFAULT_CUDA_PEAK_TFLOPS,
    forward_flops,
    mfu,
    resolve_peak_tflops,
    training_flops,
)

# h=8, 2 layers, 2 query heads of dim 4, 1 kv head, MLP width 16, vocab 10.
CONFIG = Qwen2Config(hidden_size=8, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                     intermediate_size=16, vocab_size=10)


def test_forward_and_training_flops_match_a_hand_count():
    shape = DecoderShape.from_hf_config(CONFIG, text_config=False)
    # Per layer: q 8x8=64, k 8x4=32, v 32, o 64, MLP 3x8x16=384 -> 576 weights.
    assert shape.linear_params_per_layer == 576
    lengths = torch.tensor([3, 5])  # 8 tokens; sum s(s+1) = 12 + 30 = 42
    linear = 2 * 576 * 8  # 9216 per layer
    attention = 2 * 8 * 42  # QK^T and AV: 2 x q_width x sum s(s+1) = 672 per layer
    head = 2 * 8 * 10 * 4  # LM head on 4 response tokens = 640
    expected_forward = 2 * (linear + attention) + head  # 20416
    assert forward_flops(shape, lengths, head_tokens=4, head_width=10) == expected_forward == 20416
    assert training_flops(shape, lengths, head_tokens=4, head_width=10) == 3 * 20416
    # A value head: width 1 on every token.
    assert forward_flops(shape, lengths, head_tokens=8, head_width=1) == 2 * (linear + attention) + 2 * 8 * 8


def test_linear_params_equal_the_decoder_layers_linear_weights_of_a_real_model():
    model = Qwen2ForCausalLM(CONFIG)
    weights = sum(
        module.weight.numel()
        for name, module in model.model.layers.named_modules()
        if isinstance(module, torch.nn.Linear)
    )
    assert weights == CONFIG.num_hidden_layers * DecoderShape.from_hf_config(CONFIG, text_config=False).linear_params_per_layer


def test_explicit_head_dim_is_used():
    shape = DecoderShape(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         intermediate_size=4, vocab_size=3, head_dim=8)
    # q and o are 8x16, k and v 8x8, MLP 3x8x4.
    assert shape.linear_params_per_layer == 128 + 64 + 64 + 128 + 96


def test_mfu_and_peak_resolution():
    assert mfu(3e12, seconds=2.0, num_devices=3, peak_tflops=1.0) == pytest.approx(0.5)
    assert resolve_peak_tflops(None, "cuda") == DEFAULT_CUDA_PEAK_TFLOPS
    assert resolve_peak_tflops(None, "cpu") is None
    assert resolve_peak_tflops(2.5, "cpu") == 2.5
    with pytest.raises(ValueError, match="must all be positive"):
        mfu(1.0, seconds=0.0, num_devices=1, peak_tflops=1.0)
