"""torch's varlen FlashAttention (what attn_implementation="varlen" runs on CUDA) against per-sequence sdpa:
outputs and gradients of packed rows, with grouped-query heads, in bf16."""

from __future__ import annotations

import pytest
import torch

from verl_like.engine import varlen_attention


@pytest.mark.skipif(not varlen_attention.torch_varlen_available(), reason="needs torch's CUDA varlen kernel")
def test_varlen_kernel_matches_per_sequence_sdpa_forward_and_backward():
    torch.manual_seed(0)
    lengths = [17, 300, 1, 128, 64]
    position_ids = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0).cuda()
    tokens, heads, kv_heads, dim = sum(lengths), 14, 2, 64
    leaves = [torch.randn(1, h, tokens, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
              for h in (heads, kv_heads, kv_heads)]
    out, _ = varlen_attention.varlen_attention_forward(None, *leaves, None, scaling=dim ** -0.5,
                                                       position_ids=position_ids)
    grad = torch.randn_like(out)
    out.backward(grad)
    got = [out.detach()] + [leaf.grad.clone() for leaf in leaves]

    ref_leaves = [leaf.detach().double().requires_grad_() for leaf in leaves]
    q, k, v = (t[0].transpose(0, 1) for t in ref_leaves)
    bounds, _ = varlen_attention.cu_seqlens(position_ids)
    ref = varlen_attention._per_sequence_sdpa(q, k, v, bounds.cpu(), dim ** -0.5).unsqueeze(0)
    ref.backward(grad.double())
    expected = [ref.detach()] + [leaf.grad for leaf in ref_leaves]
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, expected):
        torch.testing.assert_close(a.double(), b, atol=3e-2, rtol=3e-2, msg=name)
