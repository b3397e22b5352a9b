"""Triton kernels for the RMSNorm and the SwiGLU activation of Qwen2/Llama-family HF models (`use_fused_kernels`).

Why: in the update of a 0.5B model on an H200, 0.46 s of the 1.46 s the GPU was busy went to elementwise kernels,
mostly transformers' eager RMSNorm (cast to float32, square, mean, rsqrt, two products, cast back: each a pass
over the activations, more in the backward) and SwiGLU (silu, product); docs/benchmarks.md, sixth session.
`apply_fused_layers(model)` swaps the forward of every supported RMSNorm and MLP module for one kernel each way:
- RMSNorm: y = w * bf16(x * rsqrt(mean(x^2) + eps)), with x in float32, as transformers computes it (the cast to
  the input dtype before the weight product included); the backward recomputes the normalised row from the saved
  1/rms and sums the weight's gradient over rows in float32;
- MLP: down(silu(gate(x)) * up(x)) with silu and the product in one kernel (float32 inside).
Only classes whose forward is exactly that are swapped (`RMSNORM_CLASSES`, `MLP_CLASSES` with a SiLU activation);
Gemma's (1 + w) norm and other activations keep their own code. CUDA only (the engine refuses it elsewhere).
"""

from __future__ import annotations

import functools
import types
from typing import Any, NamedTuple

import torch
from torch import nn

RMSNORM_CLASSES = ("Qwen2RMSNorm", "Qwen3RMSNorm", "LlamaRMSNorm", "MistralRMSNorm")
MLP_CLASSES = ("Qwen2MLP", "Qwen3MLP", "LlamaMLP", "MistralMLP")
_SILU_CLASSES = ("SiLU", "SiLUActivation")  # torch's, and transformers 5's ACT2FN["silu"]
_ROWS_PER_PROGRAM = 16  # rows whose weight gradients one backward program adds up before they are summed


def apply_fused_layers(model: nn.Module) -> dict[str, int]:
    """Swaps the forward of every supported RMSNorm and SiLU MLP in `model`; returns how many of each."""
    counts = {"rms_norm": 0, "mlp": 0}
    for module in model.modules():
        name = type(module).__name__
        if name in RMSNORM_CLASSES:
            module.forward = types.MethodType(_rms_norm_forward, module)
            counts["rms_norm"] += 1
        elif name in MLP_CLASSES and type(getattr(module, "act_fn", None)).__name__ in _SILU_CLASSES:
            module.forward = types.MethodType(_mlp_forward, module)
            counts["mlp"] += 1
    return counts


def _rms_norm_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    return rms_norm(hidden_states, self.weight, self.variance_epsilon)


def _mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return self.down_proj(silu_mul(self.gate_proj(x), self.up_proj(x)))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm of `x` (..., hidden) with `weight` (hidden,), fused; differentiable in both."""
    return _RMSNorm.apply(x, weight, float(eps))


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, elementwise, in the inputs' dtype; differentiable in both."""
    return _SiluMul.apply(gate, up)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        rows_view = x.reshape(-1, x.shape[-1]).contiguous()
        rows, hidden = rows_view.shape
        out_dtype = torch.promote_types(weight.dtype, x.dtype)
        y = torch.empty((rows, hidden), dtype=out_dtype, device=x.device)
        rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
        _kernels().rms_forward[(rows,)](rows_view, weight, y, rstd, hidden, eps, BLOCK=_block(hidden))
        ctx.save_for_backward(rows_view, weight, rstd)
        ctx.x_shape = x.shape
        return y.view(*x.shape[:-1], hidden)

    @staticmethod
    def backward(ctx, grad_y):
        rows_view, weight, rstd = ctx.saved_tensors
        rows, hidden = rows_view.shape
        grad_y = grad_y.reshape(rows, hidden).contiguous()
        grad_x = torch.empty_like(rows_view)
        programs = (rows + _ROWS_PER_PROGRAM - 1) // _ROWS_PER_PROGRAM
        partial_dw = torch.empty((programs, hidden), dtype=torch.float32, device=rows_view.device)
        _kernels().rms_backward[(programs,)](
            rows_view, weight, rstd, grad_y, grad_x, partial_dw, rows, hidden,
            ROWS=_ROWS_PER_PROGRAM, BLOCK=_block(hidden),
        )
        grad_w = partial_dw.sum(dim=0).to(weight.dtype)
        return grad_x.view(ctx.x_shape), grad_w, None


class _SiluMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):
        if gate.shape != up.shape:
            raise ValueError(f"silu_mul: gate {tuple(gate.shape)} and up {tuple(up.shape)} differ")
        gate_c, up_c = gate.contiguous(), up.contiguous()
        out = torch.empty_like(gate_c)
        count = out.numel()
        _kernels().silu_mul_forward[(_cdiv(count, 4096),)](gate_c, up_c, out, count, BLOCK=4096)
        ctx.save_for_backward(gate_c, up_c)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        gate, up = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        grad_gate, grad_up = torch.empty_like(gate), torch.empty_like(up)
        count = gate.numel()
        _kernels().silu_mul_backward[(_cdiv(count, 4096),)](
            gate, up, grad_out, grad_gate, grad_up, count, BLOCK=4096,
        )
        return grad_gate, grad_up


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def _block(hidden: int) -> int:
    return 1 << (hidden - 1).bit_length()


class _Kernels(NamedTuple):
    rms_forward: Any
    rms_backward: Any
    silu_mul_forward: Any
    silu_mul_backward: Any


@functools.cache
def _kernels() -> _Kernels:
    import triton
    import triton.language as tl

    @triton.jit
    def fused_rms_norm_forward(x_ptr, w_ptr, y_ptr, rstd_ptr, hidden, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < hidden
        x = tl.load(x_ptr + row * hidden + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, 0) / hidden + eps)
        normed = (x * rstd).to(x_ptr.dtype.element_ty)  # transformers casts back before the weight product
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        y = normed.to(tl.float32) * w.to(tl.float32)
        tl.store(y_ptr + row * hidden + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(rstd_ptr + row, rstd)

    @triton.jit
    def fused_rms_norm_backward(x_ptr, w_ptr, rstd_ptr, dy_ptr, dx_ptr, dw_ptr, rows, hidden,
                                ROWS: tl.constexpr, BLOCK: tl.constexpr):
        program = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < hidden
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        dw = tl.zeros([BLOCK], dtype=tl.float32)
        for i in range(ROWS):
            row = program * ROWS + i
            if row < rows:
                x = tl.load(x_ptr + row * hidden + cols, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + row * hidden + cols, mask=mask, other=0.0).to(tl.float32)
                rstd = tl.load(rstd_ptr + row)
                normed = x * rstd
                dw += dy * normed.to(x_ptr.dtype.element_ty).to(tl.float32)
                dn = dy * w
                dx = rstd * (dn - normed * (tl.sum(dn * normed, 0) / hidden))
                tl.store(dx_ptr + row * hidden + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        tl.store(dw_ptr + program * hidden + cols, dw, mask=mask)

    @triton.jit
    def fused_silu_mul_forward(gate_ptr, up_ptr, out_ptr, count, BLOCK: tl.constexpr):
        offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < count
        g = tl.load(gate_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(up_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        out = g * tl.sigmoid(g) * u
        tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def fused_silu_mul_backward(gate_ptr, up_ptr, dout_ptr, dgate_ptr, dup_ptr, count, BLOCK: tl.constexpr):
        offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < count
        g = tl.load(gate_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(up_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        d = tl.load(dout_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        sig = tl.sigmoid(g)
        silu = g * sig
        tl.store(dup_ptr + offsets, (d * silu).to(dup_ptr.dtype.element_ty), mask=mask)
        dsilu = sig * (1.0 + g * (1.0 - sig))
        tl.store(dgate_ptr + offsets, (d * u * dsilu).to(dgate_ptr.dtype.element_ty), mask=mask)

    return _Kernels(fused_rms_norm_forward, fused_rms_norm_backward, fused_silu_mul_forward, fused_silu_mul_backward)
