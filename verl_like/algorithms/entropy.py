"""Entropy of the token distribution from logits: stable, and chunked for large vocabularies."""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy `(...)` of softmax(logits) over the last dim of `logits` `(..., vocab)`.

    H = -sum_v p_v log p_v with log p from log_softmax (no exp overflow); -inf logits (masked vocabulary) add 0,
    in the value and in the gradient. Computed in float32 for half-precision logits (float64 stays float64).
    Paper: entropy bonus as in Mnih et al. 2016 (A3C, arXiv:1602.01783) and PPO (arXiv:1707.06347).
    Deviation: none.
    """
    work = logits if logits.dtype == torch.float64 else logits.float()
    log_p = torch.log_softmax(work, dim=-1)
    p = log_p.exp()
    # p == 0 where log p is -inf (or underflows): use 0 instead of log p so neither value nor grad sees 0 * inf.
    safe_log_p = torch.where(p > 0, log_p, torch.zeros_like(log_p))
    return -(p * safe_log_p).sum(-1)


def entropy_from_logits_chunked(logits: torch.Tensor, chunk_size: int = 1024) -> torch.Tensor:
    """Like :func:`entropy_from_logits`, `(..., vocab)` -> `(...)`, over `chunk_size` rows at a time.

    Peak extra memory is that of one chunk's float32 softmax instead of the whole batch's; with gradients enabled
    each chunk is recomputed in backward (activation checkpointing) so the saving holds for training too.
    Paper: as entropy_from_logits.  Deviation: none (same values and gradients).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be >= 1")
    flat = logits.reshape(-1, logits.shape[-1])
    recompute = torch.is_grad_enabled() and logits.requires_grad
    pieces = []
    for start in range(0, flat.shape[0], chunk_size):
        chunk = flat[start : start + chunk_size]
        if recompute:
            pieces.append(checkpoint(entropy_from_logits, chunk, use_reentrant=False))
        else:
            pieces.append(entropy_from_logits(chunk))
    if not pieces:  # no rows at all
        return entropy_from_logits(flat).reshape(logits.shape[:-1])
    return torch.cat(pieces).reshape(logits.shape[:-1])
