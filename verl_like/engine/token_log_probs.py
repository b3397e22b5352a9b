"""log p(label) and the entropy of softmax(logits / temperature), in float32, from logits of any float dtype.

The reference (`reference_token_log_probs`, used on CPU) casts the whole `(tokens, vocab)` logits to float32 and
lets autograd keep that copy: with a 151,936-word vocabulary one micro-batch of 26k response tokens holds 16 GB of
float32 logits, and forward plus backward stream about 100 bytes per logit through memory (cast, scale,
logsumexp's max/sub/exp/sum, and in the backward the gather's zero-filled gradient, exp, scale and cast).

On CUDA (with Triton, which ships with torch's CUDA builds) `token_log_probs` runs two fused kernels instead, one
program per token row looping over the vocabulary in blocks:
- forward: an online log-sum-exp (running max and rescaled sums, plus the rescaled sum of p·z for the entropy)
  reads each logit once (2 bytes in bf16) and writes three floats per row;
- backward: recomputes p = exp(z - lse) and writes the logits' gradient in their dtype (read 2 + write 2 bytes).
Autograd keeps the logits themselves (already alive as the LM head's output) and the per-row log-normaliser, no
float32 copy. Math: z = logits / T, lse = log Σ exp z, log p(y) = z_y - lse, H = lse - Σ p z;
d log p(y) / d z_j = [j = y] - p_j and dH / dz_j = -p_j (z_j - lse + H), both times 1/T for the logits.
`VERL_LIKE_FUSED_LOG_PROBS=0` selects the reference on CUDA too (for comparison runs).
"""

from __future__ import annotations

import functools
import os
from typing import Any, NamedTuple

import torch

_BLOCK = 4096


def reference_token_log_probs(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float, calculate_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log p(label), entropy or None) in float32, shapes `logits.shape[:-1]`; logits (..., vocab), plain torch."""
    log_probs, _, entropy = _reference_stats(logits, labels, temperature, calculate_entropy)
    return log_probs, entropy


def _reference_stats(logits: torch.Tensor, labels: torch.Tensor, temperature: float, calculate_entropy: bool):
    """(log p(label), log-normaliser, entropy or None) in float32 through plain torch (differentiable)."""
    scaled = logits.float() / temperature
    log_normaliser = torch.logsumexp(scaled, dim=-1)
    log_probs = scaled.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - log_normaliser
    entropy = None
    if calculate_entropy:
        entropy = log_normaliser - (torch.softmax(scaled, dim=-1) * scaled).sum(dim=-1)
    return log_probs, log_normaliser, entropy


def token_log_probs(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float, calculate_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log p(label), entropy or None) in float32, shapes `logits.shape[:-1]`; logits (..., vocab), labels (...).

    The fused kernels on CUDA when Triton is importable, else the reference; both are differentiable in `logits`.
    """
    if logits.is_cuda and logits.numel() > 0 and fused_log_probs_enabled():
        return _fused(logits, labels, temperature, calculate_entropy)
    return reference_token_log_probs(logits, labels, temperature, calculate_entropy)


def fused_log_probs_enabled() -> bool:
    """Whether CUDA logits take the fused kernels (Triton importable, VERL_LIKE_FUSED_LOG_PROBS not 0)."""
    return os.environ.get("VERL_LIKE_FUSED_LOG_PROBS", "1") != "0" and _kernels() is not None


def _rows_view(logits: torch.Tensor) -> torch.Tensor:
    """`logits` as (batch, rows, vocab) with unit vocabulary stride, a view where the strides allow it."""
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    if logits.dim() == 1:
        raise ValueError(f"token_log_probs needs logits shaped (..., vocab), got {tuple(logits.shape)}")
    if logits.dim() == 2:
        return logits.unsqueeze(0)
    return logits if logits.dim() == 3 else logits.flatten(0, -3)


def _check_labels(labels: torch.Tensor, vocab: int) -> None:
    outside = (labels < 0) | (labels >= vocab)
    if bool(outside.any()):
        bad = labels[outside][0].item()
        raise ValueError(f"token_log_probs: label {bad} is outside the vocabulary [0, {vocab})")


def _fused(logits: torch.Tensor, labels: torch.Tensor, temperature: float, calculate_entropy: bool):
    if labels.shape != logits.shape[:-1]:
        raise ValueError(f"labels {tuple(labels.shape)} do not match logits {tuple(logits.shape)} without vocab")
    _check_labels(labels, logits.shape[-1])
    log_probs, entropy = _FusedTokenLogProbs.apply(logits, labels, float(temperature), calculate_entropy)
    return log_probs, (entropy if calculate_entropy else None)


def log_prob_stats(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float, calculate_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(log p(label), log-normaliser, entropy or None), float32 `(rows,)`, of logits `(rows, vocab)`, no autograd:
    the fused forward kernel on CUDA (when enabled), else float32 torch. With `log_prob_grad` this is the pair the
    chunked LM head (engine/head_log_probs.py) runs on one chunk of logits at a time."""
    if logits.is_cuda and fused_log_probs_enabled():
        return _fused_stats(logits.unsqueeze(0), labels.reshape(-1).to(torch.int64).contiguous(), temperature,
                            calculate_entropy)
    with torch.no_grad():
        return _reference_stats(logits, labels, temperature, calculate_entropy)


def log_prob_grad(logits: torch.Tensor, labels: torch.Tensor, grad_log_probs: torch.Tensor,
                  grad_entropy: torch.Tensor | None, lse: torch.Tensor, entropy: torch.Tensor | None,
                  temperature: float) -> torch.Tensor:
    """The gradient of Σ g·log p(label) + Σ g_ent·H with respect to logits `(rows, vocab)`, in the logits' dtype,
    from `log_prob_stats`' log-normaliser and entropy (the backward kernel on CUDA, else float32 torch)."""
    if logits.is_cuda and fused_log_probs_enabled():
        use_entropy = grad_entropy is not None and entropy is not None
        grad_lp = grad_log_probs.reshape(-1).float().contiguous()
        return _fused_grad(logits.unsqueeze(0), labels.reshape(-1).to(torch.int64).contiguous(), grad_lp,
                           grad_entropy.reshape(-1).float().contiguous() if use_entropy else grad_lp, lse,
                           entropy if use_entropy else lse, temperature, use_entropy)[0]
    with torch.no_grad():
        scaled = logits.float() / temperature
        p = torch.exp(scaled - lse.unsqueeze(-1))
        grad = -grad_log_probs.float().unsqueeze(-1) * p
        grad.scatter_add_(-1, labels.unsqueeze(-1), grad_log_probs.float().unsqueeze(-1))
        if grad_entropy is not None and entropy is not None:
            grad -= grad_entropy.float().unsqueeze(-1) * p * (scaled - lse.unsqueeze(-1) + entropy.unsqueeze(-1))
        return (grad / temperature).to(logits.dtype)


def _fused_stats(view: torch.Tensor, flat_labels: torch.Tensor, temperature: float, calculate_entropy: bool):
    """The forward kernel on `view` (batch, rows, vocab): (log_probs, lse, entropy or None), float32 flat."""
    batch, rows, vocab = view.shape
    count = batch * rows
    log_probs = torch.empty(count, dtype=torch.float32, device=view.device)
    lse = torch.empty_like(log_probs)
    entropy = torch.empty_like(log_probs) if calculate_entropy else lse
    _kernels().forward[(count,)](
        view, view.stride(0), view.stride(1), rows, flat_labels, log_probs, lse, entropy, vocab,
        1.0 / temperature, WITH_ENTROPY=calculate_entropy, BLOCK=_BLOCK, num_warps=8,
    )
    return log_probs, lse, (entropy if calculate_entropy else None)


def _fused_grad(view, flat_labels, grad_lp, grad_ent, lse, entropy, temperature: float, use_entropy: bool):
    """The backward kernel: the logits' gradient `(batch, rows, vocab)` in their dtype."""
    batch, rows, vocab = view.shape
    grad = torch.empty((batch, rows, vocab), dtype=view.dtype, device=view.device)
    _kernels().backward[(batch * rows,)](
        view, view.stride(0), view.stride(1), rows, flat_labels, grad_lp, grad_ent, lse, entropy, grad,
        vocab, 1.0 / temperature, WITH_ENTROPY=use_entropy, BLOCK=_BLOCK, num_warps=8,
    )
    return grad


class _FusedTokenLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, temperature, calculate_entropy):
        view = _rows_view(logits)
        flat_labels = labels.reshape(-1).to(torch.int64).contiguous()
        log_probs, lse, entropy = _fused_stats(view, flat_labels, temperature, calculate_entropy)
        ctx.save_for_backward(view, flat_labels, lse, entropy if calculate_entropy else lse)
        ctx.logits_shape = logits.shape
        ctx.temperature = temperature
        ctx.calculate_entropy = calculate_entropy
        shape = logits.shape[:-1]
        if not calculate_entropy:
            entropy = log_probs.new_zeros(0)
            ctx.mark_non_differentiable(entropy)
            return log_probs.view(shape), entropy
        return log_probs.view(shape), entropy.view(shape)

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy):
        view, labels, lse, entropy = ctx.saved_tensors
        use_entropy = ctx.calculate_entropy and grad_entropy is not None
        if grad_log_probs is None and not use_entropy:
            return None, None, None, None
        grad_lp = (grad_log_probs.reshape(-1).float().contiguous() if grad_log_probs is not None
                   else lse.new_zeros(lse.shape[0]))
        grad_ent = grad_entropy.reshape(-1).float().contiguous() if use_entropy else grad_lp
        grad = _fused_grad(view, labels, grad_lp, grad_ent, lse, entropy, ctx.temperature, use_entropy)
        return grad.view(ctx.logits_shape), None, None, None


@functools.cache
def _kernels():
    """The two Triton kernels, or None without Triton (CPU-only torch builds)."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def token_log_probs_forward(logits, stride_b, stride_r, rows, labels, log_probs, lse_out, entropy_out, vocab,
                                inv_temp, WITH_ENTROPY: tl.constexpr, BLOCK: tl.constexpr):
        index = tl.program_id(0).to(tl.int64)
        row = logits + (index // rows) * stride_b + (index % rows) * stride_r
        total = tl.sum(tl.zeros([BLOCK], dtype=tl.float32), 0)  # float32 scalars carried through the loop
        weighted = total
        running_max = total - float("inf")
        for start in range(0, vocab, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            z = tl.load(row + cols, mask=cols < vocab, other=-float("inf")).to(tl.float32) * inv_temp
            new_max = tl.maximum(running_max, tl.max(z, 0))
            shift = tl.where(new_max == -float("inf"), 0.0, new_max)  # all -inf so far: keep the sums at 0
            rescale = tl.exp(running_max - shift)
            p = tl.exp(z - shift)
            total = total * rescale + tl.sum(p, 0)
            if WITH_ENTROPY:
                weighted = weighted * rescale + tl.sum(tl.where(p > 0, p * z, 0.0), 0)
            running_max = new_max
        lse = running_max + tl.log(total)
        label = tl.load(labels + index)
        chosen = tl.load(row + label).to(tl.float32) * inv_temp
        tl.store(log_probs + index, chosen - lse)
        tl.store(lse_out + index, lse)
        if WITH_ENTROPY:
            tl.store(entropy_out + index, lse - weighted / total)

    @triton.jit
    def token_log_probs_backward(logits, stride_b, stride_r, rows, labels, grad_lp, grad_ent, lse_in, entropy_in,
                                 grad, vocab, inv_temp, WITH_ENTROPY: tl.constexpr, BLOCK: tl.constexpr):
        index = tl.program_id(0).to(tl.int64)
        row = logits + (index // rows) * stride_b + (index % rows) * stride_r
        out = grad + index * vocab
        g = tl.load(grad_lp + index)
        lse = tl.load(lse_in + index)
        label = tl.load(labels + index)
        if WITH_ENTROPY:
            g_ent = tl.load(grad_ent + index)
            entropy = tl.load(entropy_in + index)
        for start in range(0, vocab, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            in_vocab = cols < vocab
            z = tl.load(row + cols, mask=in_vocab, other=-float("inf")).to(tl.float32) * inv_temp
            p = tl.exp(z - lse)
            d = tl.where(cols == label, g, 0.0) - g * p
            if WITH_ENTROPY:
                d -= tl.where(p > 0, g_ent * p * (z - lse + entropy), 0.0)
            tl.store(out + cols, (d * inv_temp).to(grad.dtype.element_ty), mask=in_vocab)

    return _Kernels(forward=token_log_probs_forward, backward=token_log_probs_backward)


class _Kernels(NamedTuple):
    forward: Any
    backward: Any
