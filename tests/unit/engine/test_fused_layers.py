"""use_fused_kernels on the CPU machine: which modules of a Qwen2 model get the fused forward, and the refusal
without CUDA (the kernels themselves are checked against float64 on a GPU: tests/gpu/test_fused_layers_gpu.py)."""

from __future__ import annotations

import pytest
from transformers import Qwen2Config, Qwen2ForCausalLM

from verl_like.engine.config import EngineConfig
from verl_like.engine.fused_layers import apply_fused_layers
from verl_like.engine.model_loading import load_model
from verl_like.models.tiny import build_tiny_model


def test_every_rms_norm_and_silu_mlp_of_a_qwen2_model_is_swapped():
    config = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=100)
    model = Qwen2ForCausalLM(config)
    # two norms per decoder layer and the final one; one MLP per layer
    assert apply_fused_layers(model) == {"rms_norm": 3 * 2 + 1, "mlp": 3}
    assert all("forward" in vars(layer.mlp) for layer in model.model.layers)


def test_an_mlp_with_another_activation_keeps_its_forward():
    config = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=100, hidden_act="gelu")
    assert apply_fused_layers(Qwen2ForCausalLM(config)) == {"rms_norm": 2 * 2 + 1, "mlp": 0}


def test_fused_kernels_without_cuda_are_refused_naming_the_key(tmp_path):
    path = build_tiny_model(tmp_path / "tiny")
    with pytest.raises(ValueError, match="actor_rollout_ref.model.use_fused_kernels=false"):
        load_model(EngineConfig(model_path=str(path), fused_kernels=True))
