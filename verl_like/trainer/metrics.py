"""Per-step metrics computed on the driver from the finished batch and the phase timings."""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np
import torch

from verl_like.protocol import DataProto
from verl_like.shapes.decoder import DecoderShape
from verl_like.utils.flops import mfu, training_flops
from verl_like.utils.tracking import MEMORY_METRICS

logger = logging.getLogger(__name__)


@contextmanager
def timed(timings: dict[str, float], name: str) -> Iterator[None]:
    """Adds the wall time of the block to timings[name] (seconds)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - start


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    if values.numel() == 0:
        return {}
    values = values.double()
    return {f"{prefix}/mean": values.mean().item(), f"{prefix}/max": values.max().item(), f"{prefix}/min": values.min().item()}


def data_metrics(batch: DataProto, max_response_length: int) -> dict[str, float]:
    """Score, reward, advantage, return, value and length statistics of one training batch."""
    b = batch.batch
    mask = b["response_mask"].bool()
    response_length = mask.sum(-1).double()
    prompt_length = b["attention_mask"][:, : -b["responses"].shape[1]].sum(-1).double()
    metrics: dict[str, float] = {}
    metrics.update(_stats("critic/score", b["token_level_scores"].sum(-1)))
    metrics.update(_stats("critic/rewards", b["token_level_rewards"].sum(-1)))
    metrics.update(_stats("critic/advantages", b["advantages"][mask]))
    metrics.update(_stats("critic/returns", b["returns"][mask]))
    if "values" in b.keys():
        metrics.update(_stats("critic/values", b["values"][mask]))
        returns, values = b["returns"][mask].double(), b["values"][mask].double()
        var = returns.var() if returns.numel() > 1 else torch.tensor(0.0, dtype=torch.float64)
        metrics["critic/vf_explained_var"] = (1.0 - (returns - values).var() / (var + 1e-8)).item() if returns.numel() > 1 else 0.0
    metrics.update(_stats("response_length", response_length))
    metrics["response_length/clip_ratio"] = (response_length >= max_response_length).double().mean().item()
    metrics.update(_stats("prompt_length", prompt_length))
    return metrics


def throughput_metrics(batch: DataProto, timings: dict[str, float], world_size: int) -> dict[str, float]:
    """Tokens per second of the step (prompt + response tokens), overall and per worker."""
    tokens = float(batch.batch["attention_mask"].sum().item())
    step_s = timings.get("step", 0.0)
    metrics = {"perf/total_num_tokens": tokens}
    if step_s > 0:
        metrics["perf/throughput"] = tokens / step_s
        metrics["perf/throughput_per_worker"] = tokens / step_s / world_size
    if timings.get("gen", 0.0) > 0:
        generated = float(batch.batch["response_mask"].sum().item())
        metrics["perf/rollout_tokens_per_s"] = generated / timings["gen"]
    return metrics



def mfu_metrics(
    batch: DataProto,
    timings: dict[str, float],
    world_size: int,
    peak_tflops: float | None,
    actor: tuple[DecoderShape, int] | None,
    critic: tuple[DecoderShape, int] | None,
) -> dict[str, float]:
    """perf/mfu/actor and perf/mfu/critic: model FLOPs of the update phases over their wall time (utils/flops.py).

    actor / critic: (model shape, PPO epochs) of a role that updated this step, else None. The actor's head is
    the LM head on the response tokens, the critic's a width-1 value head on every token. Nothing without a
    peak (CPU without trainer.peak_tflops_per_device).
    """
    if peak_tflops is None:
        return {}
    lengths = batch.batch["attention_mask"].sum(dim=1)
    metrics = {}
    if actor is not None and timings.get("update_actor", 0.0) > 0:
        shape, epochs = actor
        response_tokens = int(batch.batch["response_mask"].sum())
        flops = epochs * training_flops(shape, lengths, response_tokens, shape.vocab_size)
        metrics["perf/mfu/actor"] = mfu(flops, timings["update_actor"], world_size, peak_tflops)
    if critic is not None and timings.get("update_critic", 0.0) > 0:
        shape, epochs = critic
        flops = epochs * training_flops(shape, lengths, int(lengths.sum()), 1)
        metrics["perf/mfu/critic"] = mfu(flops, timings["update_critic"], world_size, peak_tflops)
    return metrics


def _largest_over_workers(key: str) -> bool:
    """Memory metrics (perf/max_memory_allocated_gb, perf/critic/cpu_memory_used_gb, ...) report the worker that
    needed the most, not the mean, since the largest is what has to fit."""
    return key.startswith("perf/") and key.rpartition("/")[2] in MEMORY_METRICS


def mean_metrics(result: Any) -> dict[str, float]:
    """Per-worker metric lists (from DataProto.concat or a list of dicts) averaged into scalars; memory metrics
    take the largest worker's value instead."""
    if isinstance(result, DataProto):
        raw = result.meta_info.get("metrics", {})
    elif isinstance(result, (list, tuple)):
        raw: dict[str, list] = {}
        for item in result:
            for k, v in (item or {}).items():
                raw.setdefault(k, []).extend(v if isinstance(v, list) else [v])
    else:
        raw = dict(result or {})
    out = {}
    for key, value in raw.items():
        values = value if isinstance(value, list) else [value]
        numbers = [float(v) for v in values if isinstance(v, (int, float)) or hasattr(v, "item")]
        if numbers:
            out[key] = float(max(numbers) if _largest_over_workers(key) else np.mean(numbers))
    return out


class ToolCallWatch:
    """Warns when a run with tools makes no tool call for `patience` steps in a row (a parser that never fires, a
    template that hides the tools, a policy that stopped calling them); once per dry spell."""

    def __init__(self, multi_turn: Any, patience: int = 3) -> None:
        self.active = bool(multi_turn.enable and multi_turn.tool_config_path)
        self.patience = patience
        self.dry_steps = 0

    def observe(self, metrics: dict[str, float], step: int) -> bool:
        """Records a step's agent/tool_calls; True when it warned."""
        if not self.active or "agent/tool_calls" not in metrics:
            return False
        self.dry_steps = 0 if metrics["agent/tool_calls"] > 0 else self.dry_steps + 1
        if self.dry_steps != self.patience:
            return False
        logger.warning(
            "no tool call in the last %d steps (to step %d) although multi_turn is on with tools: check that the "
            "policy's calls match multi_turn.format (agent/malformed_calls=%g) and that the chat template shows it "
            "the tools", self.patience, step, metrics.get("agent/malformed_calls", 0.0))
        return True
