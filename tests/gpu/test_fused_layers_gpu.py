"""use_fused_kernels on CUDA: the Triton RMSNorm and SiLU-product kernels against float64 and against
transformers' own modules, and a Qwen2 model with them against the same model without (logits and gradients)."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from verl_like.engine import fused_layers
from verl_like.engine.config import EngineConfig
from verl_like.engine.model_loading import load_model
from verl_like.models.tiny import build_tiny_model


def _rms_reference(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


@pytest.mark.parametrize("hidden", [896, 1536, 128])
def test_rms_norm_matches_float64_in_float32(hidden):
    torch.manual_seed(0)
    x = (torch.randn(1000, hidden, device="cuda") * 3).requires_grad_()
    w = (torch.randn(hidden, device="cuda") * 0.3 + 1).requires_grad_()
    y = fused_layers.rms_norm(x, w, 1e-6)
    grad = torch.randn_like(y)
    y.backward(grad)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    y64 = _rms_reference(x64, w64, 1e-6)
    y64.backward(grad.double())
    torch.testing.assert_close(y.double(), y64, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(w.grad.double(), w64.grad, atol=1e-3, rtol=1e-4)


def test_rms_norm_in_bf16_rounds_where_transformers_does():
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    torch.manual_seed(1)
    norm = Qwen2RMSNorm(896, eps=1e-6).cuda().to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(896) * 0.3 + 1)
    x = (torch.randn(4, 300, 896, device="cuda") * 2).to(torch.bfloat16)
    grad = torch.randn(4, 300, 896, device="cuda").to(torch.bfloat16)
    leaf_hf = x.clone().requires_grad_()
    norm(leaf_hf).backward(grad)
    hf_dw, norm.weight.grad = norm.weight.grad.clone(), None
    leaf = x.clone().requires_grad_()
    y = fused_layers.rms_norm(leaf, norm.weight, norm.variance_epsilon)
    y.backward(grad)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y, norm(x), atol=0.07, rtol=1e-2)  # at most about one bf16 step apart
    torch.testing.assert_close(leaf.grad, leaf_hf.grad, atol=0.07, rtol=2e-2)
    torch.testing.assert_close(norm.weight.grad.float(), hf_dw.float(), atol=1.0, rtol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_matches_float64(dtype):
    torch.manual_seed(2)
    gate = (torch.randn(3, 257, 4864, device="cuda") * 3).to(dtype).requires_grad_()
    up = torch.randn(3, 257, 4864, device="cuda").to(dtype).requires_grad_()
    out = fused_layers.silu_mul(gate, up)
    grad = torch.randn_like(out)
    out.backward(grad)
    g64, u64 = gate.detach().double().requires_grad_(), up.detach().double().requires_grad_()
    ref = torch.nn.functional.silu(g64) * u64
    ref.backward(grad.double())
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 1e-2}
    torch.testing.assert_close(out.double(), ref, **tol)
    torch.testing.assert_close(gate.grad.double(), g64.grad, **tol)
    torch.testing.assert_close(up.grad.double(), u64.grad, **tol)


def test_a_qwen2_model_with_fused_layers_matches_the_model_without():
    torch.manual_seed(3)
    config = Qwen2Config(hidden_size=256, intermediate_size=704, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=1000)
    plain = Qwen2ForCausalLM(config).cuda()
    fused = Qwen2ForCausalLM(config).cuda()
    fused.load_state_dict(plain.state_dict())
    assert fused_layers.apply_fused_layers(fused) == {"rms_norm": 5, "mlp": 2}
    fused.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    plain.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    fused.train(), plain.train()
    tokens = torch.randint(0, 1000, (4, 64), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = {name: model(input_ids=tokens).logits.float() for name, model in (("plain", plain), ("fused", fused))}
    torch.testing.assert_close(logits["fused"], logits["plain"], atol=5e-2, rtol=5e-2)
    for name, model in (("plain", plain), ("fused", fused)):
        torch.log_softmax(logits[name], -1).gather(-1, tokens.unsqueeze(-1)).mean().backward()
    for (param_name, p_plain), p_fused in zip(plain.named_parameters(), fused.parameters()):
        scale = p_plain.grad.abs().max().item() + 1e-6
        assert (p_fused.grad - p_plain.grad).abs().max().item() <= 0.05 * scale, param_name


def test_the_engine_loads_the_model_with_fused_layers(tmp_path):
    path = build_tiny_model(tmp_path / "tiny")
    model = load_model(EngineConfig(model_path=str(path), fused_kernels=True))
    swapped = [m for m in model.modules() if "forward" in vars(m)]
    assert {type(m).__name__ for m in swapped} == {"Qwen2RMSNorm", "Qwen2MLP"}
