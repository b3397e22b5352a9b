"""Splitting a rank's rows into micro-batches so that every data-parallel rank runs the same number of them.

FSDP all-gathers parameters in every forward, so a rank that ran one micro-batch fewer than the others would
leave them waiting forever. Each rank computes how many micro-batches it needs, the group agrees on the largest
count (one all_reduce), and each rank splits its rows into exactly that many. A planning error on one rank is
raised on every rank instead of hanging the others.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from tensordict import TensorDict

from verl_like.engine.base import LOSS_COUNTS_KEY, LossFn
from verl_like.engine.config import MicroBatching
from verl_like.engine.model_outputs import response_mask_of
from verl_like.engine.vision import VISION_TENSOR_KEYS
from verl_like.protocol import DataProto
from verl_like.utils.seqlen_balancing import min_parts_within_budget, partition_within_budget

logger = logging.getLogger(__name__)

# Image prompts add their pixels (engine/vision.py), carried row by row like the ids.
MODEL_INPUT_KEYS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask", *VISION_TENSOR_KEYS)


def engine_inputs(batch: DataProto, model_kind: str, engine_name: str) -> DataProto:
    """The batch narrowed to what an engine's forward reads; raises naming the missing keys (every kind but
    sequence_classifier needs `responses`)."""
    keys = [key for key in MODEL_INPUT_KEYS if key in batch.batch.keys()]
    needed = ["input_ids", "attention_mask", "position_ids"]
    if model_kind != "sequence_classifier":
        needed.append("responses")
    missing = [key for key in needed if key not in keys]
    if missing:
        raise KeyError(f"{engine_name} ({model_kind}): the batch lacks {missing}; it has {sorted(batch.batch.keys())}")
    return batch.select(batch_keys=keys, non_tensor_keys=[], meta_keys=[])


def engine_micro_batches(batch: DataProto, micro_batching: MicroBatching, group: dist.ProcessGroup,
                         row_check: Callable[[TensorDict], None] | None = None, multiple: int = 1) -> list[list[int]]:
    """`plan_micro_batches` as `micro_batching` says (by row count, or by token budget)."""
    return plan_micro_batches(batch.batch, micro_batching.micro_batch_size, micro_batching.max_tokens, group,
                              row_check, multiple)


def _local_count(num_rows: int, lengths: list[int], micro_batch_size: int, max_tokens: int | None) -> int:
    if max_tokens is not None:
        return min_parts_within_budget(lengths, max_tokens)
    return -(-num_rows // micro_batch_size)


def plan_micro_batches(
    tensors: TensorDict,
    micro_batch_size: int,
    max_tokens: int | None,
    group: dist.ProcessGroup | None,
    row_check: Callable[[TensorDict], None] | None = None,
    multiple: int = 1,
) -> list[list[int]]:
    """Row indices of each micro-batch; the same count on every rank of `group` (a collective), rounded up to a
    multiple of `multiple` (Megatron's interleaved schedule runs whole groups of pipeline-size micro-batches).

    `max_tokens` None: consecutive rows, `micro_batch_size` at a time (a rank with fewer rows than others splits
    them into the agreed count, evenly). `max_tokens` set: rows grouped so that each micro-batch holds at most
    `max_tokens` valid tokens (attention_mask ones), balanced by token count. `row_check` (e.g. the image
    placeholder check, engine/vision.py) runs on the rows first; its ValueError is raised like a planning error.
    """
    num_rows = int(tensors.batch_size[0])
    lengths = [int(n) for n in tensors["attention_mask"].sum(dim=1).tolist()]
    error: Exception | None = None
    count = 0
    try:
        if num_rows == 0:
            raise ValueError("the engine got a batch with 0 rows; every data-parallel rank needs at least one")
        if row_check is not None:
            row_check(tensors)
        count = _local_count(num_rows, lengths, micro_batch_size, max_tokens)
    except ValueError as exc:
        error = exc
    # One all_reduce(max) carries the micro-batch count, the smallest row count (negated) and a failure flag.
    agreed = torch.tensor([count, -num_rows, int(error is not None)], dtype=torch.long)
    if dist.is_initialized():
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=group)
    num_micro_batches, fewest_rows, failed = int(agreed[0]), -int(agreed[1]), bool(agreed[2])
    if error is not None:
        raise error
    if failed:
        raise RuntimeError("another data-parallel rank could not plan its micro-batches; its error says why")
    num_micro_batches = -(-num_micro_batches // multiple) * multiple
    if fewest_rows < num_micro_batches:
        why = f", a multiple of {multiple} (the pipeline size, for the interleaved schedule)" if multiple > 1 else ""
        raise ValueError(
            f"a data-parallel rank has {fewest_rows} rows but another needs {num_micro_batches} micro-batches{why}; "
            f"every rank must hold at least that many rows (raise max_tokens_per_rank / micro_batch_size_per_rank "
            "or send more rows per rank)"
        )
    if max_tokens is not None:
        return partition_within_budget(lengths, max_tokens, num_micro_batches)
    if num_micro_batches == count:
        return [list(range(s, min(s + micro_batch_size, num_rows))) for s in range(0, num_rows, micro_batch_size)]
    bounds = [round(i * num_rows / num_micro_batches) for i in range(num_micro_batches + 1)]
    return [list(range(bounds[i], bounds[i + 1])) for i in range(num_micro_batches)]


def global_counts(tensors: TensorDict, group: dist.ProcessGroup | None) -> tuple[int, int]:
    """(valid response tokens, sequences with at least one of them) summed over the ranks of `group` (a collective).

    For a batch without `responses` the tokens are all valid tokens. A row without a valid token (a skipped DPO
    pair, an empty response) is no sequence: it would only dilute a sequence mean.
    """
    mask = response_mask_of(tensors) if "responses" in tensors.keys() else tensors["attention_mask"]
    counts = torch.tensor([int(mask.sum()), int((mask.sum(-1) > 0).sum())], dtype=torch.long)
    if dist.is_initialized():
        dist.all_reduce(counts, op=dist.ReduceOp.SUM, group=group)
    return int(counts[0]), int(counts[1])


def loss_micro_batches(batch: DataProto, groups: list[list[int]], group: dist.ProcessGroup | None,
                       temperature: float, device: torch.device | str) -> Iterator[DataProto]:
    """Each micro-batch of `batch` on `device`, its meta_info carrying what a loss normalises by: the token and
    sequence counts of the whole global batch (`global_counts`, a collective run before the first; or, where the
    batch's meta_info has LOSS_COUNTS_KEY, those of the mini-batch its rows were taken from) and the temperature.
    Both engines' `forward_backward` train over these."""
    given = batch.meta_info.get(LOSS_COUNTS_KEY)
    token_count, sequence_count = given if given is not None else global_counts(batch.batch, group)
    for indices in groups:
        micro_batch = batch[indices].to(device)
        micro_batch.meta_info.update(
            global_token_count=token_count, global_sequence_count=sequence_count, temperature=temperature
        )
        yield micro_batch


def checked_loss(loss_fn: LossFn, outputs: dict[str, torch.Tensor],
                 micro_batch: DataProto) -> tuple[torch.Tensor, dict[str, Any]]:
    """`loss_fn`'s (loss, metrics) on one micro-batch; raises unless the loss is a 0-d tensor."""
    loss, loss_metrics = loss_fn(outputs, micro_batch)
    if not isinstance(loss, torch.Tensor) or loss.ndim != 0:
        raise TypeError(f"loss_fn must return a 0-d tensor as its loss, got {type(loss).__name__} "
                        f"{getattr(loss, 'shape', '')}")
    return loss, loss_metrics
