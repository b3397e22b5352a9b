"""The PPO update loop the actor and the critic share: epochs over mini-batches, one optimizer step each.

Per mini-batch, the engine counts the whole mini-batch's valid tokens and sequences over its DP group and hands
them to the loss with every micro-batch (the loss contract in engine/base.py); each micro-batch's
`LossNormalizer` is built from those counts, the engine accumulates the gradient of the mini-batch loss over
this rank's micro-batches and sums it over ranks, and `optimizer_step` applies it. Mini-batch k is the k-th
slice of every rank's (possibly shuffled) rows; with the same rows in each mini-batch, the update is the same
whether the rows sit on one rank or on many.

Rows whose loss can have no gradient may be left out (`trains`, the actor's zero-advantage rows, see
`PPOActor.zero_advantage_rows_add_nothing`): each mini-batch is counted whole first, so the normaliser is the one
of all its rows, and only the rows that train run their forward and backward. The gradient is the same (up to
the order of float sums); the update is faster by the share of rows left out (metric skipped_row_frac).

Metrics are data-parallel-invariant too: a role's loss function reports its micro-batch's loss *shares*
(summed over micro-batches and ranks, they give the mini-batch loss) and its micro-batch token means weighted
by the micro-batch's valid tokens (`metric_entries`), and maxima (`max_entry`); `reduce_metrics` turns them into
mini-batch values with one all_reduce (two with maxima), so a metric equals what one process computes on the whole
mini-batch.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from typing import Protocol

import torch
import torch.distributed as dist

from verl_like.algorithms import LossNormalizer
from verl_like.engine.base import LOSS_COUNTS_KEY, LossFn, TrainEngine
from verl_like.engine.micro_batches import global_counts
from verl_like.engine.model_outputs import response_mask_of
from verl_like.protocol import DataProto

logger = logging.getLogger(__name__)

_SHARE = "share/"
_WEIGHTED = "weighted/"
_MAX = "max/"
_TOKENS = "tokens"


class PPOUpdateSettings(Protocol):
    """What the loop reads from the role's config node (ActorConfig and CriticConfig both provide it)."""

    PREFIX: str
    ppo_epochs: int
    shuffle: bool
    data_loader_seed: int
    loss_agg_mode: str

    def mini_batch_size_per_rank(self, dp_size: int, rollout_n: int) -> int: ...


def epoch_order(num_rows: int, *, shuffle: bool, seed: int, step: int, epoch: int) -> torch.Tensor:
    """Row order of one epoch `(num_rows,)`: 0..n-1, or a permutation drawn from (seed, step, epoch).

    Every rank holds the same number of rows and draws the same permutation; `step` (the engine's optimizer step
    when the update starts) makes each update shuffle differently and keeps resumed runs reproducible.
    """
    if not shuffle:
        return torch.arange(num_rows)
    generator = torch.Generator().manual_seed((seed * 1_000_003 + step) * 1_009 + epoch)
    return torch.randperm(num_rows, generator=generator)


def metric_entries(
    shares: dict[str, torch.Tensor], token_means: dict[str, torch.Tensor], response_mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """A loss function's metrics for `reduce_metrics`: loss shares as they are, token means times valid tokens."""
    tokens = response_mask.sum().to(torch.float64)
    entries = {_SHARE + name: value.detach() for name, value in shares.items()}
    entries.update({_WEIGHTED + name: value.detach().double() * tokens for name, value in token_means.items()})
    entries[_TOKENS] = tokens
    return entries


def max_entry(name: str, value: torch.Tensor) -> dict[str, torch.Tensor]:
    """A loss function's metric `name` whose mini-batch value is its maximum over micro-batches and ranks."""
    return {_MAX + name: value.detach().double()}


def reduce_metrics(per_micro_batch: dict[str, list[float]], group: dist.ProcessGroup) -> dict[str, float]:
    """Mini-batch metrics from `metric_entries` (and `max_entry`) of this rank's micro-batches, reduced over the
    ranks of `group` (every rank reports the same names)."""
    peaks = sorted(name for name in per_micro_batch if name.startswith(_MAX))
    names = sorted(name for name in per_micro_batch if not name.startswith(_MAX))
    totals = torch.tensor([sum(per_micro_batch[name]) for name in names], dtype=torch.float64)
    dist.all_reduce(totals, group=group)
    summed = dict(zip(names, totals.tolist()))
    tokens = summed.get(_TOKENS, 0.0)
    metrics = {}
    if peaks:
        maxima = torch.tensor([max(per_micro_batch[name]) for name in peaks], dtype=torch.float64)
        dist.all_reduce(maxima, op=dist.ReduceOp.MAX, group=group)
        metrics.update({name[len(_MAX):]: value for name, value in zip(peaks, maxima.tolist())})
    for name, value in summed.items():
        if name.startswith(_SHARE):
            metrics[name[len(_SHARE):]] = value
        elif name.startswith(_WEIGHTED):
            metrics[name[len(_WEIGHTED):]] = value / tokens if tokens > 0 else 0.0
    return metrics


def check_rows(batch: DataProto, settings: PPOUpdateSettings, mini_batch_size: int) -> None:
    """Raises unless this rank's rows split into whole mini-batches of `mini_batch_size`."""
    if len(batch) == 0 or len(batch) % mini_batch_size:
        raise ValueError(
            f"this rank holds {len(batch)} samples, not a positive multiple of its mini-batch share "
            f"{mini_batch_size} ({settings.PREFIX}.ppo_mini_batch_size x rollout.n / data-parallel size); send "
            f"a batch of a multiple of {settings.PREFIX}.ppo_mini_batch_size prompts x rollout.n samples"
        )


def run_ppo_update(
    engine: TrainEngine,
    batch: DataProto,
    settings: PPOUpdateSettings,
    make_loss_fn: Callable[[LossNormalizer], LossFn],
    *,
    rollout_n: int,
    loss_scale_factor: float | None = None,
    temperature: float = 1.0,
    calculate_entropy: bool = False,
    lr_scale: float = 1.0,
    trains: Callable[[DataProto], torch.Tensor] | None = None,
) -> dict[str, list[float]]:
    """Runs `settings.ppo_epochs` passes over `batch` (this rank's rows), one optimizer step per mini-batch.

    A mini-batch holds settings.ppo_mini_batch_size prompts x `rollout_n` samples over all ranks.

    `make_loss_fn(normalizer)` gives the loss function of one mini-batch (see verl_like.engine.base for the loss
    contract; its metrics come from `metric_entries`). Returns, per metric name, one value per mini-batch step
    (same on every rank), plus "grad_norm" and "lr" (the learning rate each step used: the scheduled one times
    `lr_scale`, which the asynchronous driver lowers for stale batches, see AsyncTrainingConfig).
    `trains(rows)`: a bool per row, False where the row's loss has no gradient whatever the weights; those rows
    run no forward or backward (`rows_that_train`) and "skipped_row_frac" reports their share.
    """
    mini_batch_size = settings.mini_batch_size_per_rank(engine.dp_size, rollout_n)
    check_rows(batch, settings, mini_batch_size)
    if settings.loss_agg_mode == "seq-mean-token-sum-norm" and loss_scale_factor is None:
        loss_scale_factor = padded_response_length(batch, engine.dp_group)
    loss_fn = normalized_loss_fn(make_loss_fn, settings.loss_agg_mode, loss_scale_factor)
    first_step = engine.global_step
    history: dict[str, list[float]] = defaultdict(list)
    for epoch in range(settings.ppo_epochs):
        order = epoch_order(
            len(batch), shuffle=settings.shuffle, seed=settings.data_loader_seed, step=first_step, epoch=epoch
        )
        for start in range(0, len(batch), mini_batch_size):
            mini_batch = batch[order[start : start + mini_batch_size]]
            skipped = None
            if trains is not None:
                mini_batch, skipped = rows_that_train(mini_batch, trains(mini_batch), engine.dp_group,
                                                      row_multiple=engine.micro_batch_multiple)
            result = engine.forward_backward(
                mini_batch, loss_fn, temperature=temperature, calculate_entropy=calculate_entropy
            )
            metrics = reduce_metrics(result.metrics, engine.dp_group)
            metrics["lr"] = engine.current_lr * lr_scale
            metrics["grad_norm"] = engine.optimizer_step(lr_scale=lr_scale)
            if skipped is not None:
                metrics["skipped_row_frac"] = skipped
            for name, value in metrics.items():
                history[name].append(value)
    logger.debug("%s: %d optimizer steps from step %d", settings.PREFIX, engine.global_step - first_step, first_step)
    return dict(history)


def rows_that_train(mini_batch: DataProto, trains: torch.Tensor, group: dist.ProcessGroup | None,
                    row_multiple: int = 1) -> tuple[DataProto, float]:
    """`mini_batch` (this rank's rows) narrowed to the rows `trains` marks, with the token and sequence counts of
    the whole mini-batch over the ranks of `group` in its meta_info (LOSS_COUNTS_KEY, what the loss normalises
    by), and the share of the mini-batch's rows over all ranks that run no forward or backward. Collectives.

    Every rank keeps the same number of rows: the most any rank marks (at least one), rounded up to a multiple of
    `row_multiple` (the engine's micro_batch_multiple, so that its micro-batch count can be one) or to all the rows
    it has. A rank that marks fewer fills up with unmarked rows in order, which only add zeros to the gradient, so
    the ranks' micro-batches stay as even as before.
    """
    if trains.shape != (len(mini_batch),) or trains.dtype != torch.bool:
        raise ValueError(f"trains must be a bool per row ({len(mini_batch)},), got {trains.dtype} {tuple(trains.shape)}")
    counts = global_counts(mini_batch.batch, group)
    marked = torch.nonzero(trains).flatten().tolist()
    kept = torch.tensor([max(len(marked), 1)], dtype=torch.long)
    if dist.is_initialized():
        dist.all_reduce(kept, op=dist.ReduceOp.MAX, group=group)
    keep = min(-(-int(kept) // row_multiple) * row_multiple, len(mini_batch))  # the same len on every rank
    fillers = torch.nonzero(~trains).flatten().tolist()[: keep - len(marked)]
    rows = sorted(marked + fillers)
    subset = mini_batch[rows]
    narrowed = DataProto(subset.batch, subset.non_tensor_batch, {**mini_batch.meta_info, LOSS_COUNTS_KEY: counts})
    return narrowed, 1.0 - keep / len(mini_batch)


def normalized_loss_fn(
    make_loss_fn: Callable[[LossNormalizer], LossFn], loss_agg_mode: str, loss_scale_factor: float | None
) -> LossFn:
    """The loss function the engine runs: each micro-batch's loss normalised by the mini-batch counts the engine
    put in its meta_info (no collective of its own)."""

    def loss_fn(outputs: dict[str, torch.Tensor], micro_batch: DataProto) -> tuple[torch.Tensor, dict]:
        normalizer = LossNormalizer.from_engine_counts(
            micro_batch.meta_info, loss_agg_mode, loss_scale_factor=loss_scale_factor
        )
        return make_loss_fn(normalizer)(outputs, micro_batch)

    return loss_fn


def padded_response_length(batch: DataProto, group: dist.ProcessGroup) -> float:
    """Dr.GRPO's default constant: the widest padded response over the ranks of `group` (a collective)."""
    length = torch.tensor([float(response_mask_of(batch.batch).shape[-1])], dtype=torch.float64)
    dist.all_reduce(length, op=dist.ReduceOp.MAX, group=group)
    return float(length)


def mean_metrics(history: dict[str, list[float]], prefix: str) -> dict[str, float]:
    """`{prefix/name: mean over the update's steps}`."""
    return {f"{prefix}/{name}": sum(values) / len(values) for name, values in history.items()}
