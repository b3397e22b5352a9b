"""Loss aggregation with a global normaliser: micro-batches and DP ranks add up to the mini-batch's gradient.

The denominator of every mode (token count, sequence count, Dr.GRPO's constant) must come from the whole
mini-batch, across gradient-accumulation micro-batches and data-parallel ranks; dividing by a micro-batch's own
count gives a different gradient whenever micro-batches hold different numbers of tokens. So the API has no
``loss_agg_mode`` string at the point of use: every loss takes a :class:`LossNormalizer`, built once per
mini-batch from the full mini-batch mask, which carries the mode and the global denominators together.

Use, per mini-batch on each DP rank::

    normalizer = LossNormalizer.for_mini_batch(mini_batch.response_mask, config.loss_agg_mode, dp_group=group)
    for micro in micro_batches:
        loss, metrics = policy_loss(..., response_mask=micro.response_mask, normalizer=normalizer)
        loss.backward()  # grads accumulate; DP reduction as declared by grad_reduction
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

import torch
import torch.distributed as dist

from verl_like.algorithms.masked import check_same_shape
from verl_like.config.names import LOSS_AGG_MODES

GRAD_REDUCTIONS = ("mean", "sum")


def _check_mode(loss_agg_mode: str) -> None:
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(
            f"actor.loss_agg_mode={loss_agg_mode!r} is not a known loss aggregation mode; "
            f"valid modes: {', '.join(LOSS_AGG_MODES)}"
        )


@dataclass(frozen=True)
class LossNormalizer:
    """The mini-batch-wide denominators of one loss aggregation mode; build with ``for_mini_batch``.

    loss_agg_mode: one of LOSS_AGG_MODES (config key ``actor.loss_agg_mode`` / ``critic.loss_agg_mode``).
    num_tokens: valid tokens in the whole mini-batch (all micro-batches, all DP ranks).
    num_seqs: sequences with at least one valid token in the whole mini-batch.
    loss_scale_factor: Dr.GRPO's constant length (``actor.loss_scale_factor``); set for ``seq-mean-token-sum-norm``
        only, None for the other modes.
    grad_scale: factor on every aggregated loss: the DP size when the engine averages gradients over DP ranks
        (FSDP/DDP default), 1 when it sums them.
    """

    loss_agg_mode: str
    num_tokens: float
    num_seqs: float
    loss_scale_factor: float | None = None
    grad_scale: float = 1.0

    def __post_init__(self) -> None:
        _check_mode(self.loss_agg_mode)
        if self.num_tokens < 0 or self.num_seqs < 0:
            raise ValueError(f"num_tokens={self.num_tokens} and num_seqs={self.num_seqs} must be >= 0")
        if self.loss_agg_mode == "seq-mean-token-sum-norm":
            if self.loss_scale_factor is None or not self.loss_scale_factor > 0:
                raise ValueError(
                    f"actor.loss_scale_factor={self.loss_scale_factor} must be > 0 for seq-mean-token-sum-norm"
                )
        elif self.loss_scale_factor is not None:
            raise ValueError(
                f"loss_scale_factor is only used by seq-mean-token-sum-norm, not {self.loss_agg_mode!r}; leave it None"
            )
        if not self.grad_scale > 0:
            raise ValueError(f"grad_scale={self.grad_scale} must be > 0")

    @property
    def denominator(self) -> float:
        """What the summed (per-token or per-sequence) loss of the whole mini-batch is divided by."""
        if self.loss_agg_mode == "token-mean":
            denom = self.num_tokens
        elif self.loss_agg_mode == "seq-mean-token-sum-norm":
            denom = self.num_seqs * self.loss_scale_factor  # type: ignore[operator]  # set for this mode
        else:
            denom = self.num_seqs
        return denom if denom > 0 else 1.0  # nothing valid: every summed term is 0 anyway

    @classmethod
    def for_mini_batch(
        cls,
        response_mask: torch.Tensor,
        loss_agg_mode: str,
        *,
        dp_group: dist.ProcessGroup | None,
        grad_reduction: Literal["mean", "sum"] = "mean",
        loss_scale_factor: float | None = None,
    ) -> "LossNormalizer":
        """Normaliser of this rank's mini-batch `response_mask` `(mini_batch, response_len)`, all-reduced over DP.

        dp_group: the data-parallel group whose ranks together form the global mini-batch; ``None`` only for a
            single DP rank. Required so that a DP caller cannot silently fall back to rank-local counts.
        grad_reduction: how the engine combines gradients across `dp_group`: ``"mean"`` (FSDP/DDP default, the
            loss is scaled by the DP size to undo it) or ``"sum"``.
        loss_scale_factor: constant for ``seq-mean-token-sum-norm`` (ignored by the other modes); default the
            largest padded response length over the DP group (set it to the generation budget,
            data.max_response_length, to follow Dr.GRPO exactly).
        """
        _check_mode(loss_agg_mode)
        if grad_reduction not in GRAD_REDUCTIONS:
            raise ValueError(f"grad_reduction={grad_reduction!r} must be one of {GRAD_REDUCTIONS}")
        if response_mask.dim() != 2:
            raise ValueError(f"response_mask must be (mini_batch, response_len), got {tuple(response_mask.shape)}")
        mask = response_mask.to(torch.float64)
        counts = torch.stack([mask.sum(), (mask.sum(-1) > 0).to(torch.float64).sum()])
        uses_scale = loss_agg_mode == "seq-mean-token-sum-norm"
        length = torch.tensor(float(response_mask.shape[-1]), dtype=torch.float64, device=mask.device)
        dp_size = 1
        if dp_group is not None:
            dp_size = dist.get_world_size(dp_group)
            dist.all_reduce(counts, op=dist.ReduceOp.SUM, group=dp_group)
            if uses_scale and loss_scale_factor is None:
                dist.all_reduce(length, op=dist.ReduceOp.MAX, group=dp_group)
        num_tokens, num_seqs = counts.tolist()
        if uses_scale and loss_scale_factor is None:
            loss_scale_factor = float(length.item())
        return cls(
            loss_agg_mode=loss_agg_mode,
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            loss_scale_factor=float(loss_scale_factor) if uses_scale else None,
            grad_scale=float(dp_size) if grad_reduction == "mean" else 1.0,
        )

    @classmethod
    def from_engine_counts(
        cls,
        meta_info: Mapping[str, Any],
        loss_agg_mode: str,
        *,
        loss_scale_factor: float | None = None,
    ) -> "LossNormalizer":
        """Normaliser of a micro-batch from the mini-batch counts a TrainEngine puts in its `meta_info`.

        The engine's loss contract (engine/base.py): "global_token_count" and "global_sequence_count" over every
        data-parallel rank, gradients summed over ranks (grad_scale 1). No collective: the engine counted once.
        loss_scale_factor: required for ``seq-mean-token-sum-norm`` (the caller's constant or padded length).
        """
        _check_mode(loss_agg_mode)
        missing = [key for key in ("global_token_count", "global_sequence_count") if key not in meta_info]
        if missing:
            raise KeyError(f"micro_batch.meta_info lacks {missing}: the engine's forward_backward sets them (the "
                           "loss contract in verl_like/engine/base.py)")
        uses_scale = loss_agg_mode == "seq-mean-token-sum-norm"
        return cls(
            loss_agg_mode=loss_agg_mode,
            num_tokens=float(meta_info["global_token_count"]),
            num_seqs=float(meta_info["global_sequence_count"]),
            loss_scale_factor=float(loss_scale_factor) if uses_scale and loss_scale_factor is not None else None,
        )

    @classmethod
    def from_shard_masks(
        cls,
        shard_masks: Sequence[torch.Tensor],
        loss_agg_mode: str,
        *,
        grad_reduction: Literal["mean", "sum"] = "mean",
        loss_scale_factor: float | None = None,
    ) -> "LossNormalizer":
        """The normaliser ``for_mini_batch`` gives every rank, computed in one process from all DP shards' masks.

        For a driver that holds every shard, and as the reference for the all-reduce path in tests.
        """
        if not shard_masks:
            raise ValueError("shard_masks is empty; pass one (mini_batch, response_len) mask per DP rank")
        if grad_reduction not in GRAD_REDUCTIONS:
            raise ValueError(f"grad_reduction={grad_reduction!r} must be one of {GRAD_REDUCTIONS}")
        per_shard = [cls.for_mini_batch(m, loss_agg_mode, dp_group=None, grad_reduction="sum") for m in shard_masks]
        uses_scale = loss_agg_mode == "seq-mean-token-sum-norm"
        if uses_scale and loss_scale_factor is None:
            loss_scale_factor = float(max(m.shape[-1] for m in shard_masks))
        return cls(
            loss_agg_mode=loss_agg_mode,
            num_tokens=sum(n.num_tokens for n in per_shard),
            num_seqs=sum(n.num_seqs for n in per_shard),
            loss_scale_factor=float(loss_scale_factor) if uses_scale else None,
            grad_scale=float(len(shard_masks)) if grad_reduction == "mean" else 1.0,
        )


def aggregate_loss(loss_mat: torch.Tensor, response_mask: torch.Tensor, normalizer: LossNormalizer) -> torch.Tensor:
    """This micro-batch's share of the mini-batch loss (a scalar) from per-token losses `(batch, response_len)`.

    token-mean:              sum_{i,t} m l / N_tokens
    seq-mean-token-sum:      sum_i (sum_t m l) / N_seqs
    seq-mean-token-mean:     sum_i (sum_t m l / sum_t m) / N_seqs
    seq-mean-token-sum-norm: sum_{i,t} m l / (N_seqs * loss_scale_factor)   (Dr.GRPO, arXiv:2503.20783)
    with N_* over the whole mini-batch, times ``normalizer.grad_scale``. Summed over micro-batches and DP ranks
    this is the full mini-batch loss, and so is the gradient.
    Papers: token-mean is DAPO's token-level loss (arXiv:2503.14476); seq-mean-token-mean is GRPO's
    (arXiv:2402.03300).
    Deviation: sequences without a valid token do not count in N_seqs (padding rows do not dilute the mean).
    """
    if not isinstance(normalizer, LossNormalizer):
        raise TypeError(
            f"normalizer must be a LossNormalizer, got {type(normalizer).__name__}; build one per mini-batch with "
            "LossNormalizer.for_mini_batch(mini_batch_response_mask, loss_agg_mode, dp_group=...)"
        )
    check_same_shape(loss_mat=loss_mat, response_mask=response_mask)
    mask = response_mask.bool()
    # where(), not multiply: padding positions may hold inf/NaN (e.g. log-probs of pad tokens).
    masked = torch.where(mask, loss_mat, torch.zeros_like(loss_mat))
    if normalizer.loss_agg_mode == "seq-mean-token-mean":
        total = (masked.sum(-1) / mask.sum(-1).clamp_min(1).to(loss_mat.dtype)).sum()
    else:
        total = masked.sum()
    return total * (normalizer.grad_scale / normalizer.denominator)
