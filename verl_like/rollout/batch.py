"""Converts between verl's padded rollout batch layout and the per-sample token lists engines work with."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from verl_like.data.mrope import MROPE_POSITIONS, continue_positions
from verl_like.protocol import DataProto
from verl_like.rollout.base import SamplingConfig

PROMPT_KEYS = ("input_ids", "attention_mask", "position_ids")


def prompt_token_lists(prompts: DataProto) -> list[list[int]]:
    """The unpadded token ids of each prompt row, read from left-padded `input_ids` and `attention_mask`."""
    missing = [key for key in PROMPT_KEYS if key not in prompts.batch.keys()]
    if missing:
        raise KeyError(f"rollout input lacks {missing}; it needs {list(PROMPT_KEYS)}, each (batch, prompt_len)")
    input_ids = prompts.batch["input_ids"]
    mask = prompts.batch["attention_mask"].bool()
    # Left padding: once a row's mask turns 1 it stays 1 to the end.
    starts = mask.int().argmax(dim=-1)
    positions = torch.arange(mask.shape[1]).unsqueeze(0)
    expected = positions >= starts.unsqueeze(1)
    empty = ~mask.any(dim=-1)
    if empty.any():
        raise ValueError(f"rollout input rows {torch.nonzero(empty).flatten().tolist()[:5]} have no prompt tokens")
    if not torch.equal(mask, expected):
        bad = torch.nonzero((mask != expected).any(dim=-1)).flatten().tolist()[:5]
        raise ValueError(f"rollout input rows {bad} are not left-padded; pad prompts on the left (padding_side='left')")
    return [row[start:].tolist() for row, start in zip(input_ids, starts.tolist())]


def build_rollout_batch(
    prompts: DataProto,
    responses: Sequence[Sequence[int]],
    log_probs: Sequence[Sequence[float]] | None,
    sampling: SamplingConfig,
    pad_token_id: int,
    metrics: dict[str, float],
) -> DataProto:
    """Assembles the output batch of `RolloutEngine.generate` from per-sample responses.

    `responses[i*n + j]` / `log_probs[i*n + j]` are sample j of prompt i (unpadded, at most max_tokens long);
    `log_probs` None (the engine skipped them: SamplingConfig.log_probs) leaves `rollout_log_probs` out.
    """
    n, width = sampling.n, sampling.max_tokens
    rows = len(prompts) * n
    with_log_probs = log_probs is not None
    log_probs = log_probs if with_log_probs else [None] * len(responses)
    if len(responses) != rows or len(log_probs) != rows:
        raise ValueError(f"expected {rows} responses and log-prob rows, got {len(responses)} and {len(log_probs)}")
    response_ids = torch.full((rows, width), pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((rows, width), dtype=torch.long)
    rollout_log_probs = torch.zeros((rows, width), dtype=torch.float32)
    for row, (tokens, token_log_probs) in enumerate(zip(responses, log_probs)):
        length = len(tokens)
        if length > width or (with_log_probs and len(token_log_probs) != length):
            raise ValueError(f"sample {row}: {length} tokens and "
                             f"{len(token_log_probs) if with_log_probs else 'no'} log-probs for max_tokens={width}")
        response_ids[row, :length] = torch.as_tensor(list(tokens), dtype=torch.long)
        response_mask[row, :length] = 1
        if with_log_probs:
            rollout_log_probs[row, :length] = torch.as_tensor(list(token_log_probs), dtype=torch.float32)

    batch = prompts.batch
    prompt_ids = batch["input_ids"].repeat_interleave(n, dim=0)
    prompt_mask = batch["attention_mask"].repeat_interleave(n, dim=0)
    prompt_positions = batch["position_ids"].repeat_interleave(n, dim=0)
    offsets = torch.arange(1, width + 1, dtype=prompt_positions.dtype).unsqueeze(0)
    response_positions = prompt_positions[:, -1:] + offsets

    tensors = {
        key: batch[key].repeat_interleave(n, dim=0) for key in batch.keys() if key not in PROMPT_KEYS
    }
    tensors.update(
        prompts=prompt_ids,
        responses=response_ids,
        response_mask=response_mask,
        input_ids=torch.cat([prompt_ids, response_ids], dim=1),
        attention_mask=torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)], dim=1),
        position_ids=torch.cat([prompt_positions, response_positions], dim=1),
    )
    if with_log_probs:
        tensors["rollout_log_probs"] = rollout_log_probs
    if MROPE_POSITIONS in batch.keys():  # Qwen2-VL: the prompt's 3-D positions, counted on over the response
        tensors[MROPE_POSITIONS] = continue_positions(batch[MROPE_POSITIONS].repeat_interleave(n, dim=0), width)
    non_tensors = {key: np.repeat(value, n, axis=0) for key, value in prompts.non_tensor_batch.items()}
    meta_info = dict(prompts.meta_info)
    meta_info["metrics"] = {**meta_info.get("metrics", {}), **metrics}
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta_info)


def generation_metrics(responses: Sequence[Sequence[int]]) -> dict[str, float]:
    """Token counts of one generate call, under `rollout/` names. The rate is not an engine's to report: one
    engine sees one share of the rollout (`rollout_rate` is computed by whoever sees all of it)."""
    tokens = sum(len(r) for r in responses)
    return {
        "rollout/generated_tokens": float(tokens),
        "rollout/mean_response_length": tokens / max(len(responses), 1),
    }


def rollout_rate(tokens: float, seconds: float) -> dict[str, float]:
    """rollout/tokens_per_s and rollout/generate_s of a whole rollout: all its tokens over its wall time (the
    colocated workers all-reduce their counts and their slowest time first; the server client sees all)."""
    return {"rollout/tokens_per_s": tokens / seconds if seconds > 0 else 0.0, "rollout/generate_s": seconds}
