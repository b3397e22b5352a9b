"""Masked reductions, whitening and group ids shared by the estimators and losses."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float64 if any input is float64, else float32 (half-precision inputs are upcast for the arithmetic)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def check_same_shape(**tensors: torch.Tensor) -> None:
    """Raise ValueError naming the arguments whose shapes differ."""
    shapes = {name: tuple(t.shape) for name, t in tensors.items() if t is not None}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{name}{shape}" for name, shape in shapes.items())
        raise ValueError(f"these tensors must have one shape (batch, response_len): {listed}")


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `values` where `mask` is set; `mask` is bool or 0/1 float of the same shape."""
    return (values * mask.to(values.dtype)).sum() if dim is None else (values * mask.to(values.dtype)).sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` where `mask` is set; 0 where nothing is set (never NaN)."""
    count = mask.to(values.dtype).sum() if dim is None else mask.to(values.dtype).sum(dim)
    return masked_sum(values, mask, dim) / count.clamp_min(1)


def masked_var(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Unbiased (Bessel-corrected) variance over the set entries; 0 when fewer than two are set."""
    mask = mask.to(values.dtype)
    count = mask.sum()
    mean = masked_sum(values, mask) / count.clamp_min(1)
    sq = masked_sum((values - mean) ** 2, mask)
    return torch.where(count > 1, sq / (count - 1).clamp_min(1), torch.zeros_like(sq))


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """`(values - mean) / sqrt(var + eps)` over the set entries (unbiased var), zero where `mask` is unset."""
    mask_f = mask.to(values.dtype)
    mean = masked_sum(values, mask_f) / mask_f.sum().clamp_min(1)
    whitened = (values - mean) * torch.rsqrt(masked_var(values, mask_f) + eps)
    return whitened * mask_f


def masked_max(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Largest set entry (0 when nothing is set); no host sync."""
    mask = mask.bool()
    top = values.masked_fill(~mask, float("-inf")).max()
    return torch.where(mask.any(), top, torch.zeros_like(top))


def masked_min(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Smallest set entry (0 when nothing is set); no host sync."""
    return -masked_max(-values, mask)


def group_ids(index: torch.Tensor | np.ndarray | Sequence, device: torch.device | str = "cpu") -> torch.Tensor:
    """Dense group ids `(batch,)` int64 in [0, num_groups) from uids (int tensor, numpy array or list of str/int).

    Samples with equal uid share a group (the `rollout.n` responses to one prompt).
    """
    if isinstance(index, torch.Tensor):
        if index.dim() != 1:
            raise ValueError(f"index must be 1-D (batch,), got shape {tuple(index.shape)}")
        return torch.unique(index, return_inverse=True)[1].to(device=device, dtype=torch.long)
    array = np.asarray(index)
    if array.ndim != 1:
        raise ValueError(f"index must be 1-D (batch,), got shape {array.shape}")
    inverse = np.unique(array, return_inverse=True)[1].reshape(-1)
    return torch.as_tensor(inverse, dtype=torch.long, device=device)


def group_mean_std(scores: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample group mean, unbiased group std and group size, each `(batch,)`, for `scores` `(batch,)`.

    Groups of one get std 0.
    """
    num_groups = int(ids.max().item()) + 1 if ids.numel() else 0
    size = torch.zeros(num_groups, dtype=scores.dtype, device=scores.device).index_add_(0, ids, torch.ones_like(scores))
    total = torch.zeros_like(size).index_add_(0, ids, scores)
    mean = total / size
    sq = torch.zeros_like(size).index_add_(0, ids, (scores - mean[ids]) ** 2)
    std = torch.where(size > 1, (sq / (size - 1).clamp_min(1)).sqrt(), torch.zeros_like(sq))
    return mean[ids], std[ids], size[ids]
