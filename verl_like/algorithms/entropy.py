"""Entropy of the token distribution from logits: stable, and chunked for large vocabularies."""

from __future__ import annotations

import torch


def _work_dtype(logits: torch.Tensor) -> torch.dtype:
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


def _probs_and_safe_log_probs(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax and log_softmax in the work dtype, with log p replaced by 0 where p == 0 (e.g. -inf logits), so
    p * log p is 0 there in value and gradient instead of 0 * inf."""
    log_p = torch.log_softmax(logits.to(_work_dtype(logits)), dim=-1)
    p = log_p.exp()
    return p, torch.where(p > 0, log_p, torch.zeros_like(log_p))


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy `(...)` of softmax(logits) over the last dim of `logits` `(..., vocab)`.

    H = -sum_v p_v log p_v with log p from log_softmax (no exp overflow); -inf logits (masked vocabulary) add 0,
    in the value and in the gradient. Computed in float32 for half-precision logits (float64 stays float64).
    Paper: entropy bonus as in Mnih et al. 2016 (A3C, arXiv:1602.01783) and PPO (arXiv:1707.06347).
    Deviation: none.
    """
    p, safe_log_p = _probs_and_safe_log_probs(logits)
    return -(p * safe_log_p).sum(-1)


class _ChunkedEntropy(torch.autograd.Function):
    """Entropy over row chunks; backward recomputes each chunk and applies dH/dz = -p (log p + H)."""

    @staticmethod
    def forward(ctx, flat_logits: torch.Tensor, chunk_size: int) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(flat_logits)
        ctx.chunk_size = chunk_size
        out = flat_logits.new_empty(flat_logits.shape[0], dtype=_work_dtype(flat_logits))
        for start in range(0, flat_logits.shape[0], chunk_size):
            out[start : start + chunk_size] = entropy_from_logits(flat_logits[start : start + chunk_size])
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        (flat_logits,) = ctx.saved_tensors
        grad = torch.empty_like(flat_logits)
        for start in range(0, flat_logits.shape[0], ctx.chunk_size):
            p, safe_log_p = _probs_and_safe_log_probs(flat_logits[start : start + ctx.chunk_size])
            entropy = -(p * safe_log_p).sum(-1, keepdim=True)
            chunk_grad = -p * (safe_log_p + entropy) * grad_out[start : start + ctx.chunk_size].unsqueeze(-1)
            grad[start : start + ctx.chunk_size] = chunk_grad.to(grad.dtype)
        return grad, None


def entropy_from_logits_chunked(logits: torch.Tensor, chunk_size: int = 1024) -> torch.Tensor:
    """Like :func:`entropy_from_logits`, `(..., vocab)` -> `(...)`, over `chunk_size` rows at a time.

    Peak extra memory is one chunk's float32 softmax instead of the whole batch's, in forward and in backward
    (backward recomputes each chunk and uses dH/dz_v = -p_v (log p_v + H)); no graph is kept between chunks.
    Paper: as entropy_from_logits.  Deviation: none (same values and gradients); no double backward.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be >= 1")
    flat = logits.reshape(-1, logits.shape[-1])
    return _ChunkedEntropy.apply(flat, chunk_size).reshape(logits.shape[:-1])
