"""DataProto: the batch that moves between the driver and the worker groups.

A DataProto holds three things; the first two share one first dimension, the rows:
- `batch`: a TensorDict of tensors, each `(rows, ...)` (token ids, masks, log-probs, advantages...);
- `non_tensor_batch`: numpy arrays, usually dtype=object, each `(rows, ...)` (raw prompts, ground truth,
  data_source, uids);
- `meta_info`: values about the whole batch (temperature, global step, `metrics`).

Every operation returns a new DataProto that shares tensor and array memory with its source where it can
(select, rename, slicing); only `pop` changes the object it is called on.

Dispatch over a worker group: `padded, pad_size = pad_to_divisor(data, world)`, `padded.chunk(world)`, run,
`DataProto.concat(results)` (which merges each worker's `meta_info["metrics"]` into lists), `unpad(out, pad_size)`.

Pickling, and so Ray, ships each tensor as its raw bytes in a uint8 numpy array, out of band under pickle
protocol 5 (Ray's); an unpickled DataProto's tensors live on the CPU, each in its own writable memory.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import torch
from tensordict import TensorDict

from verl_like.protocol_ops import (
    Index,
    index_length,
    merge_meta_infos,
    normalize_index,
    pack_tensor,
    unpack_tensor,
    values_equal,
)

logger = logging.getLogger(__name__)

Keys = str | Sequence[str]


@dataclass
class DataProtoItem:
    """One row of a DataProto: tensors without the row dimension, one value per non-tensor column."""

    batch: TensorDict
    non_tensor_batch: dict[str, Any]
    meta_info: dict[str, Any]


def _as_column(key: str, value: Any) -> np.ndarray:
    """A non-tensor column as a numpy array; lists and tuples become 1-D object arrays (one entry per row)."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (list, tuple)):
        column = np.empty(len(value), dtype=object)
        for row, entry in enumerate(value):  # element-wise so that list entries stay lists, not a 2-D array
            column[row] = entry
        return column
    raise TypeError(
        f"DataProto.from_dict: non_tensors[{key!r}] is a {type(value).__name__}; pass a list or a numpy array "
        "with one entry per row"
    )


def _resolve_keys(op: str, where: str, keys: Keys | None, available: Iterable[str], default_all: bool) -> list[str]:
    """The keys an operation acts on, checked against those available; None means all or none."""
    available = list(available)
    if keys is None:
        return available if default_all else []
    keys = [keys] if isinstance(keys, str) else list(keys)
    for key in keys:
        if key not in available:
            raise KeyError(f"{op}: {where} has no key {key!r}; available: {sorted(available)}")
    return keys


class DataProto:
    """A batch of rows: `batch` (TensorDict), `non_tensor_batch` (numpy columns) and `meta_info` (dict)."""

    def __init__(
        self,
        batch: TensorDict | None = None,
        non_tensor_batch: Mapping[str, np.ndarray] | None = None,
        meta_info: Mapping[str, Any] | None = None,
    ) -> None:
        self.non_tensor_batch: dict[str, np.ndarray] = dict(non_tensor_batch or {})
        self.meta_info: dict[str, Any] = dict(meta_info or {})
        if batch is None:  # rows come from the non-tensor columns, or 0 for a meta-only proto
            first = next(iter(self.non_tensor_batch.values()), None)
            rows = len(first) if isinstance(first, np.ndarray) and first.ndim > 0 else 0
            batch = TensorDict({}, batch_size=[rows])
        self.batch: TensorDict = batch
        self.check_consistency()

    @classmethod
    def from_dict(
        cls,
        tensors: Mapping[str, torch.Tensor] | None = None,
        non_tensors: Mapping[str, Any] | None = None,
        meta_info: Mapping[str, Any] | None = None,
    ) -> DataProto:
        """Builds a DataProto from `{name: tensor (rows, ...)}`, `{name: list or array (rows, ...)}` and a meta dict."""
        tensors = dict(tensors or {})
        for key, tensor in tensors.items():
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"DataProto.from_dict: tensors[{key!r}] is a {type(tensor).__name__}, not a tensor")
            if tensor.ndim == 0:
                raise ValueError(
                    f"DataProto.from_dict: tensors[{key!r}] is a 0-d tensor; tensors need a row dimension "
                    "(put whole-batch values in meta_info)"
                )
        columns = {key: _as_column(key, value) for key, value in (non_tensors or {}).items()}
        sizes = {key: int(t.shape[0]) for key, t in tensors.items()}
        sizes.update({key: int(c.shape[0]) if c.ndim else -1 for key, c in columns.items()})
        if len(set(sizes.values())) > 1:
            raise ValueError(f"DataProto.from_dict: columns disagree on the number of rows: {sizes}")
        rows = next(iter(sizes.values()), 0)
        return cls(TensorDict(tensors, batch_size=[rows]), columns, meta_info)

    def check_consistency(self) -> None:
        """Raises if the parts disagree: row counts, a nested or non-tensor batch entry, a key in two places."""
        if not isinstance(self.batch, TensorDict):
            raise TypeError(f"DataProto.batch must be a TensorDict, got {type(self.batch).__name__}")
        if self.batch.batch_dims != 1:
            raise ValueError(
                f"DataProto.batch must have exactly one batch dimension (the rows), got batch_size="
                f"{list(self.batch.batch_size)}; build it with TensorDict(tensors, batch_size=[rows])"
            )
        for key in self.batch.keys():
            if not isinstance(key, str) or not isinstance(self.batch.get(key), torch.Tensor):
                raise TypeError(
                    f"DataProto.batch[{key!r}] is a {type(self.batch.get(key)).__name__}; the batch holds plain "
                    "tensors under string keys (put other values in non_tensor_batch)"
                )
        if not isinstance(self.non_tensor_batch, dict) or not isinstance(self.meta_info, dict):
            raise TypeError("DataProto.non_tensor_batch and DataProto.meta_info must be dicts")
        rows = len(self)
        sizes: dict[str, int] = {}
        for key, column in self.non_tensor_batch.items():
            if not isinstance(column, np.ndarray):
                raise TypeError(
                    f"DataProto.non_tensor_batch[{key!r}] is a {type(column).__name__}, not a numpy array; "
                    "use DataProto.from_dict or np.array(values, dtype=object)"
                )
            sizes[key] = int(column.shape[0]) if column.ndim else -1
        if any(size != rows for size in sizes.values()):
            raise ValueError(
                f"DataProto: non_tensor_batch row counts {sizes} do not match the batch's {rows} rows "
                f"(tensor keys: {sorted(self.batch.keys())})"
            )
        both = sorted(set(self.batch.keys()) & set(self.non_tensor_batch))
        if both:
            raise ValueError(f"DataProto: keys {both} are in both batch and non_tensor_batch; give them one home")

    def __len__(self) -> int:
        return int(self.batch.batch_size[0])

    def __repr__(self) -> str:
        tensors = ", ".join(
            f"{key}: {str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for key, t in self.batch.items()
        )
        return (
            f"DataProto(rows={len(self)}, batch={{{tensors}}}, non_tensor_batch={sorted(self.non_tensor_batch)}, "
            f"meta_info={sorted(self.meta_info)})"
        )

    def _has_columns(self) -> bool:
        return len(self.batch.keys()) > 0 or len(self.non_tensor_batch) > 0

    def _take(self, index: Index) -> DataProto:
        """The rows picked by a normalised index (a slice gives views; an index array gives copies)."""
        tensor_index = torch.from_numpy(index) if isinstance(index, np.ndarray) else index
        tensors = {key: t[tensor_index] for key, t in self.batch.items()}
        batch = TensorDict(tensors, batch_size=[index_length(index, len(self))], device=self.batch.device)
        columns = {key: column[index] for key, column in self.non_tensor_batch.items()}
        return DataProto(batch, columns, self.meta_info)

    def __getitem__(self, index: Any) -> DataProto | DataProtoItem:
        """`data[i]` gives a DataProtoItem; a slice, int list/array/tensor or bool mask gives a DataProto."""
        if isinstance(index, (int, np.integer)) and not isinstance(index, bool):
            rows = len(self)
            if not -rows <= index < rows:
                raise IndexError(f"DataProto[{index}]: index out of range for a batch of {rows} rows")
            row = int(index) % rows
            item_batch = self.batch[row]
            return DataProtoItem(
                item_batch, {key: column[row] for key, column in self.non_tensor_batch.items()}, dict(self.meta_info)
            )
        if isinstance(index, bool):
            raise TypeError("DataProto[...]: a bare bool is not an index; use a bool mask with one entry per row")
        return self._take(normalize_index(index, len(self), "DataProto[...]"))

    def _resolve_all(
        self, op: str, batch_keys: Keys | None, non_tensor_keys: Keys | None, meta_keys: Keys | None, default_all: bool
    ) -> tuple[list[str], list[str], list[str]]:
        return (
            _resolve_keys(op, "batch", batch_keys, self.batch.keys(), default_all),
            _resolve_keys(op, "non_tensor_batch", non_tensor_keys, self.non_tensor_batch, default_all),
            _resolve_keys(op, "meta_info", meta_keys, self.meta_info, default_all),
        )

    def select(
        self, batch_keys: Keys | None = None, non_tensor_keys: Keys | None = None, meta_keys: Keys | None = None
    ) -> DataProto:
        """A DataProto with only the named keys (None keeps all of that kind); tensors are shared, not copied."""
        batch_keys, non_tensor_keys, meta_keys = self._resolve_all(
            "DataProto.select", batch_keys, non_tensor_keys, meta_keys, default_all=True
        )
        batch = TensorDict(
            {key: self.batch.get(key) for key in batch_keys}, batch_size=[len(self)], device=self.batch.device
        )
        columns = {key: self.non_tensor_batch[key] for key in non_tensor_keys}
        return DataProto(batch, columns, {key: self.meta_info[key] for key in meta_keys})

    def pop(
        self, batch_keys: Keys | None = None, non_tensor_keys: Keys | None = None, meta_keys: Keys | None = None
    ) -> DataProto:
        """Removes the named keys (None removes none of that kind) from self and returns them as a DataProto."""
        batch_keys, non_tensor_keys, meta_keys = self._resolve_all(
            "DataProto.pop", batch_keys, non_tensor_keys, meta_keys, default_all=False
        )
        popped = self.select(batch_keys, non_tensor_keys, meta_keys)
        for key in batch_keys:
            del self.batch[key]
        for key in non_tensor_keys:
            del self.non_tensor_batch[key]
        for key in meta_keys:
            del self.meta_info[key]
        return popped

    def rename(self, old_keys: Keys, new_keys: Keys) -> DataProto:
        """A DataProto with batch / non-tensor columns renamed (all at once, so swapping two names works)."""
        old = [old_keys] if isinstance(old_keys, str) else list(old_keys)
        new = [new_keys] if isinstance(new_keys, str) else list(new_keys)
        if len(old) != len(new):
            raise ValueError(f"DataProto.rename: {len(old)} old keys {old} but {len(new)} new keys {new}")
        available = list(self.batch.keys()) + list(self.non_tensor_batch)
        _resolve_keys("DataProto.rename", "the batch or non_tensor_batch", old, available, default_all=False)
        mapping = dict(zip(old, new))
        tensors = {mapping.get(key, key): t for key, t in self.batch.items()}
        columns = {mapping.get(key, key): column for key, column in self.non_tensor_batch.items()}
        if len(tensors) + len(columns) != len(available) or set(tensors) & set(columns):
            raise ValueError(
                f"DataProto.rename: renaming {old} -> {new} makes two columns share a name; existing keys: "
                f"{sorted(available)}"
            )
        batch = TensorDict(tensors, batch_size=[len(self)], device=self.batch.device)
        return DataProto(batch, columns, self.meta_info)

    def union(self, other: DataProto) -> DataProto:
        """All keys of self and other; a key in both must hold equal values. A proto without columns fits any length."""
        op = "DataProto.union"
        if self._has_columns() and other._has_columns() and len(self) != len(other):
            raise ValueError(f"{op}: self has {len(self)} rows but other has {len(other)}; they must match")
        rows = len(self) if self._has_columns() else len(other)
        merged: list[dict[str, Any]] = []
        for where, mine, theirs in (
            ("batch", dict(self.batch.items()), dict(other.batch.items())),
            ("non_tensor_batch", self.non_tensor_batch, other.non_tensor_batch),
            ("meta_info", self.meta_info, other.meta_info),
        ):
            result = dict(mine)
            for key, value in theirs.items():
                if key in result and not values_equal(result[key], value):
                    raise ValueError(
                        f"{op}: {where}[{key!r}] differs between the two protos; rename or pop one of them first"
                    )
                result[key] = value
            merged.append(result)
        batch = TensorDict(merged[0], batch_size=[rows], device=self.batch.device)
        return DataProto(batch, merged[1], merged[2])

    def chunk(self, chunks: int) -> list[DataProto]:
        """`chunks` DataProtos of equal length (views); the row count must divide evenly (see pad_to_divisor)."""
        if not isinstance(chunks, int) or chunks < 1:
            raise ValueError(f"DataProto.chunk: chunks={chunks!r} must be a positive int")
        rows = len(self)
        if rows % chunks:
            raise ValueError(
                f"DataProto.chunk: {rows} rows do not split evenly into {chunks} chunks; pad first with "
                f"`padded, pad_size = pad_to_divisor(data, {chunks})` and `unpad(result, pad_size)` after collecting"
            )
        size = rows // chunks
        return [self._take(slice(i * size, (i + 1) * size)) for i in range(chunks)]

    def split(self, split_size: int) -> list[DataProto]:
        """Consecutive DataProtos of `split_size` rows, the last one shorter; an empty proto gives one empty part."""
        if not isinstance(split_size, int) or split_size < 1:
            raise ValueError(f"DataProto.split: split_size={split_size!r} must be a positive int")
        starts = range(0, len(self), split_size) if len(self) else [0]
        return [self._take(slice(start, start + split_size)) for start in starts]

    @classmethod
    def concat(cls, parts: Sequence[DataProto]) -> DataProto:
        """Stacks the rows of `parts` in order; meta_info merged as in `protocol_ops.merge_meta_infos`."""
        op = "DataProto.concat"
        parts = list(parts)
        if not parts:
            raise ValueError(f"{op}: got no parts to concatenate")
        first = parts[0]
        for number, part in enumerate(parts[1:], start=1):
            for where, theirs, mine in (
                ("batch", set(part.batch.keys()), set(first.batch.keys())),
                ("non_tensor_batch", set(part.non_tensor_batch), set(first.non_tensor_batch)),
            ):
                if theirs != mine:
                    raise ValueError(
                        f"{op}: part {number} has {where} keys {sorted(theirs)} but part 0 has {sorted(mine)}; "
                        f"missing {sorted(mine - theirs)}, extra {sorted(theirs - mine)}"
                    )
        tensors: dict[str, torch.Tensor] = {}
        for key in first.batch.keys():
            pieces = [part.batch.get(key) for part in parts]
            layouts = {(p.dtype, tuple(p.shape[1:])) for p in pieces}
            if len(layouts) > 1:
                described = [f"{str(p.dtype).removeprefix('torch.')}{list(p.shape)}" for p in pieces]
                raise ValueError(f"{op}: batch[{key!r}] has different dtypes or trailing shapes per part: {described}")
            tensors[key] = torch.cat(pieces, dim=0)
        columns: dict[str, np.ndarray] = {}
        for key in first.non_tensor_batch:
            pieces = [part.non_tensor_batch[key] for part in parts]
            if len({p.shape[1:] for p in pieces}) > 1:
                raise ValueError(f"{op}: non_tensor_batch[{key!r}] has different trailing shapes per part: "
                                 f"{[p.shape for p in pieces]}")
            columns[key] = np.concatenate(pieces, axis=0)
        rows = sum(len(part) for part in parts)
        meta_info = merge_meta_infos([part.meta_info for part in parts], op)
        return cls(TensorDict(tensors, batch_size=[rows], device=first.batch.device), columns, meta_info)

    def repeat(self, repeat_times: int, interleave: bool = True) -> DataProto:
        """Each row `repeat_times` times: interleaved (a a b b) or the whole batch tiled (a b a b)."""
        if not isinstance(repeat_times, int) or repeat_times < 1:
            raise ValueError(f"DataProto.repeat: repeat_times={repeat_times!r} must be a positive int")
        rows = np.arange(len(self), dtype=np.int64)
        index = np.repeat(rows, repeat_times) if interleave else np.tile(rows, repeat_times)
        return self._take(index)

    def reorder(self, indices: Any) -> DataProto:
        """The rows in the order `indices` gives; it must be a permutation of range(len(self))."""
        index = normalize_index(indices, len(self), "DataProto.reorder")
        if isinstance(index, slice) or not np.array_equal(np.sort(index), np.arange(len(self))):
            shown = index if isinstance(index, slice) else index.tolist()[:16]
            raise ValueError(
                f"DataProto.reorder: indices must be a permutation of range({len(self)}), got {shown}; "
                "use data[indices] to select or repeat rows"
            )
        return self._take(index)

    def to(self, device: str | torch.device) -> DataProto:
        """The same DataProto with every tensor on `device` (non-tensor columns and meta_info unchanged)."""
        return DataProto(self.batch.to(device), self.non_tensor_batch, self.meta_info)

    def __getstate__(self) -> dict[str, Any]:
        return {
            "rows": len(self),
            "tensors": [(key, *pack_tensor(t)) for key, t in self.batch.items()],
            "non_tensor_batch": self.non_tensor_batch,
            "meta_info": self.meta_info,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        tensors = {key: unpack_tensor(dtype, shape, raw) for key, dtype, shape, raw in state["tensors"]}
        self.batch = TensorDict(tensors, batch_size=[state["rows"]])
        # Ray hands numeric arrays back read-only (zero-copy from its object store); workers write into columns.
        columns = state["non_tensor_batch"]
        self.non_tensor_batch = {key: c if c.flags.writeable else c.copy() for key, c in columns.items()}
        self.meta_info = state["meta_info"]


def pad_to_divisor(data: DataProto, divisor: int) -> tuple[DataProto, int]:
    """(data padded to a multiple of `divisor` rows by repeating its first rows cyclically, pad_size).

    With nothing to pad, returns `data` itself and 0.
    """
    if not isinstance(divisor, int) or divisor < 1:
        raise ValueError(f"pad_to_divisor: divisor={divisor!r} must be a positive int")
    rows = len(data)
    pad_size = -rows % divisor
    if pad_size == 0:
        return data, 0
    index = np.concatenate([np.arange(rows), np.arange(pad_size) % rows]).astype(np.int64)
    logger.debug("pad_to_divisor: padding %d rows with %d repeated rows to a multiple of %d", rows, pad_size, divisor)
    return data._take(index), pad_size


def unpad(data: DataProto, pad_size: int) -> DataProto:
    """`data` without its last `pad_size` rows (the padding `pad_to_divisor` added)."""
    if not isinstance(pad_size, int) or not 0 <= pad_size <= len(data):
        raise ValueError(f"unpad: pad_size={pad_size!r} must be an int in [0, {len(data)}] (the data's row count)")
    return data if pad_size == 0 else data._take(slice(0, len(data) - pad_size))
