"""Helpers behind `verl_like.protocol.DataProto`: index normalisation, value equality, meta merging, tensor packing."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import torch

# The meta_info key whose per-part dicts `DataProto.concat` merges into one dict of lists.
METRICS_KEY = "metrics"

Index = slice | np.ndarray


def normalize_index(index: Any, length: int, op: str) -> Index:
    """Returns `index` as a slice with positive step or a 1-D int64 array of rows in [0, length).

    Accepts a slice, a list/tuple of ints or bools, a 1-D numpy array or torch tensor of ints or bools.
    A bool mask must have exactly `length` entries; negative ints count from the end.
    """
    if isinstance(index, slice):
        if index.step is None or index.step > 0:
            return index
        return np.arange(length, dtype=np.int64)[index].copy()  # torch cannot view negative strides
    if isinstance(index, torch.Tensor):
        index = index.detach().cpu().numpy()
    elif isinstance(index, (list, tuple)):
        index = np.asarray(index) if len(index) > 0 else np.zeros(0, dtype=np.int64)
    if not isinstance(index, np.ndarray):
        raise TypeError(
            f"{op}: cannot index with {type(index).__name__}; use an int, a slice, a list, "
            "a numpy array or a torch tensor of ints or bools"
        )
    if index.ndim != 1:
        raise IndexError(f"{op}: index must be 1-D, got shape {tuple(index.shape)}")
    if index.dtype == np.bool_:
        if index.shape[0] != length:
            raise IndexError(f"{op}: bool mask has {index.shape[0]} entries but the batch has {length} rows")
        return np.flatnonzero(index).astype(np.int64)
    if not np.issubdtype(index.dtype, np.integer):
        raise TypeError(f"{op}: index array must hold ints or bools, got dtype {index.dtype}")
    index = index.astype(np.int64)
    out_of_range = (index < -length) | (index >= length)
    if out_of_range.any():
        bad = index[out_of_range][:5].tolist()
        raise IndexError(f"{op}: indices {bad} are out of range for a batch of {length} rows")
    return np.where(index < 0, index + length, index)


def index_length(index: Index, length: int) -> int:
    """Number of rows selected by a normalised index."""
    if isinstance(index, slice):
        return len(range(*index.indices(length)))
    return int(index.shape[0])


def values_equal(a: Any, b: Any) -> bool:
    """True when two meta/column values hold the same data (tensors, arrays, containers, scalars; NaN == NaN)."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        a, b = a.detach().cpu(), b.detach().cpu()
        same = a == b
        if a.is_floating_point() or a.is_complex():
            same |= torch.isnan(a) & torch.isnan(b)
        return bool(same.all())
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.shape != b.shape:
            return False
        if a.dtype == object or b.dtype == object:
            return all(values_equal(x, y) for x, y in zip(a.ravel(), b.ravel()))
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc" and b.dtype.kind in "fc"))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(values_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(values_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return False


def _short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def merge_meta_infos(meta_infos: Sequence[dict[str, Any]], op: str) -> dict[str, Any]:
    """Merges the meta_info of several parts into one.

    A key whose value is equal in every part that has it is kept once. `meta_info["metrics"]` dicts are merged
    into one dict of lists: a scalar value is appended, a list value is extended, so that merging already
    merged metrics keeps one flat list per metric. Any other key whose values differ raises a ValueError.
    """
    merged: dict[str, Any] = {}
    first_part: dict[str, int] = {}
    for part, meta in enumerate(meta_infos):
        for key, value in meta.items():
            if key == METRICS_KEY:
                if not isinstance(value, dict):
                    raise TypeError(
                        f"{op}: meta_info[{METRICS_KEY!r}] of part {part} is a {type(value).__name__}; "
                        "it must be a dict of metric name -> value (or list of values)"
                    )
                metrics = merged.setdefault(METRICS_KEY, {})
                for name, metric in value.items():
                    values = metrics.setdefault(name, [])
                    if isinstance(metric, list):
                        values.extend(metric)
                    else:
                        values.append(metric)
            elif key not in merged:
                merged[key] = value
                first_part[key] = part
            elif not values_equal(merged[key], value):
                raise ValueError(
                    f"{op}: meta_info[{key!r}] differs between parts (part {first_part[key]}: "
                    f"{_short_repr(merged[key])}, part {part}: {_short_repr(value)}); make it equal in every part "
                    f"or report per-part values under meta_info[{METRICS_KEY!r}]"
                )
    return merged


def pack_tensor(tensor: torch.Tensor) -> tuple[str, tuple[int, ...], np.ndarray]:
    """(dtype name, shape, raw bytes as a uint8 array) of a tensor; no copy for a contiguous CPU tensor.

    The uint8 array lets pickle protocol 5 (and so Ray) ship the bytes out of band, and works for dtypes numpy
    lacks (bfloat16).
    """
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    # An empty tensor may keep odd strides through contiguous(), which view(uint8) rejects.
    raw = flat.view(torch.uint8).numpy() if flat.numel() else np.zeros(0, dtype=np.uint8)
    return str(flat.dtype).removeprefix("torch."), tuple(tensor.shape), raw


def unpack_tensor(dtype_name: str, shape: tuple[int, ...], raw: np.ndarray) -> torch.Tensor:
    """Rebuilds a CPU tensor from `pack_tensor`'s output, copying into fresh (writable, aligned) torch memory."""
    dtype = getattr(torch, dtype_name)
    out = torch.empty(shape, dtype=dtype)
    target = out.reshape(-1).view(torch.uint8)
    if target.numel() != raw.size:
        raise ValueError(f"unpack_tensor: {raw.size} bytes do not fill a {dtype_name} tensor of shape {shape}")
    if raw.size:
        target.numpy()[:] = raw  # one memcpy; works for read-only buffers from Ray's object store
    return out
