"""Packed-sequence attention without the flash-attn package: `attn_implementation="varlen"`.

transformers' sdpa path keeps the sequences of a packed row apart with a dense block-diagonal mask, which costs
O(total_tokens^2) per layer and measured 7% MFU on an H200 for a 0.5B model (docs/benchmarks.md). This module
registers a transformers attention function that cuts the packed row at the positions where `position_ids`
restart at 0 and runs causal attention per sequence:
- on CUDA, with torch's own variable-length FlashAttention kernel (`torch.nn.attention.varlen.varlen_attn`, which
  has a backward), so a training step needs no extra package;
- elsewhere, with one `scaled_dot_product_attention` call per sequence (slow, exact: the CPU tests' reference).
Only packed rows (batch 1, no attention mask) are accepted: the engine uses it with use_remove_padding.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
import torch.nn.functional as F

REGISTERED_NAME = "verl_like_varlen"


def cu_seqlens(position_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(cumulative sequence starts (num_seqs + 1,) int32, longest sequence) of a packed row's `position_ids`."""
    flat = position_ids.reshape(-1)
    if flat.numel() == 0 or int(flat[0]) != 0:
        raise ValueError("packed position_ids must start at 0 (each sequence counts 0, 1, 2, ...)")
    starts = torch.nonzero(flat == 0).flatten()
    bounds = torch.cat([starts, starts.new_tensor([flat.numel()])]).to(torch.int32)
    return bounds, int((bounds[1:] - bounds[:-1]).max())


def _per_sequence_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: torch.Tensor,
                       scale: float | None) -> torch.Tensor:
    """Causal attention of each packed sequence on its own; q (tokens, heads, dim), k/v (tokens, kv_heads, dim)."""
    out = torch.empty_like(q)
    groups = q.shape[1] // k.shape[1]
    for start, end in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        qs = q[start:end].transpose(0, 1)
        ks = k[start:end].transpose(0, 1).repeat_interleave(groups, dim=0)
        vs = v[start:end].transpose(0, 1).repeat_interleave(groups, dim=0)
        out[start:end] = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale).transpose(0, 1)
    return out


@functools.cache
def _varlen_call_options() -> tuple[bool, bool, bool]:
    """(takes scale, takes enable_gqa, takes is_causal) of this torch's `varlen_attn` (read once)."""
    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    return "scale" in params, "enable_gqa" in params, "is_causal" in params


def _torch_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: torch.Tensor, longest: int,
                  scale: float | None) -> torch.Tensor:
    """torch's varlen FlashAttention; its causal flag and GQA support differ between releases."""
    from torch.nn.attention.varlen import varlen_attn

    takes_scale, takes_gqa, takes_causal = _varlen_call_options()
    if q.shape[1] != k.shape[1] and not takes_gqa:
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    kwargs: dict[str, Any] = {"scale": scale} if takes_scale else {}
    if takes_gqa:
        kwargs["enable_gqa"] = q.shape[1] != k.shape[1]
    if takes_causal:
        kwargs["is_causal"] = True
    else:
        kwargs["window_size"] = (-1, 0)
    return varlen_attn(q, k, v, bounds, bounds, longest, longest, **kwargs)


@functools.cache
def torch_varlen_available() -> bool:
    """True when torch ships its varlen FlashAttention (CUDA builds of torch >= 2.9)."""
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


_last_bounds: tuple[torch.Tensor, tuple[torch.Tensor, int]] | None = None


def _cached_cu_seqlens(position_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """`cu_seqlens` once per forward: every layer gets the same position_ids tensor, and each computation costs a
    device-to-host sync."""
    global _last_bounds
    if _last_bounds is None or _last_bounds[0] is not position_ids:
        _last_bounds = (position_ids, cu_seqlens(position_ids))
    return _last_bounds[1]


def varlen_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    position_ids: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: q (1, heads, tokens, dim), k/v (1, kv_heads, tokens, dim) ->
    ((1, tokens, heads, dim), None)."""
    if query.shape[0] != 1 or attention_mask is not None or position_ids is None:
        raise ValueError(
            "attn_implementation='varlen' takes packed rows only (batch 1, position_ids, no attention mask); "
            "set use_remove_padding=true, or choose attn_implementation='sdpa' for padded batches"
        )
    if dropout:
        raise ValueError("attn_implementation='varlen' has no attention dropout; the engine turns dropout off")
    bounds, longest = _cached_cu_seqlens(position_ids)
    bounds = bounds.to(query.device)
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in (query, key, value))  # (tokens, heads, dim)
    if q.is_cuda and torch_varlen_available():
        out = _torch_varlen(q, k, v, bounds, longest, scaling)
    else:
        out = _per_sequence_sdpa(q, k, v, bounds, scaling)
    return out.unsqueeze(0), None


def register() -> str:
    """Registers the function with transformers (idempotent); returns the name to pass as attn_implementation."""
    from transformers import AttentionInterface

    AttentionInterface.register(REGISTERED_NAME, varlen_attention_forward)
    return REGISTERED_NAME
