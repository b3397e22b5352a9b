"""Micro-batch inputs for Megatron's GPTModel and model outputs from its (TP-gathered) logits or values.

Megatron's local attention has no packed (THD) path without TransformerEngine, so removing padding means
cutting the columns that are padding in every row of the micro-batch (the left-padded prompts' common prefix
and the right-padded responses' common suffix). The rows keep their own padding, masked by an explicit
causal-and-padding mask. RoPE in GPTModel counts positions by column, not from position_ids; a left-padded row
is therefore shifted by a constant, which rotary attention does not see (scores depend on position differences).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict

from verl_like.engine.model_outputs import response_mask_of
from verl_like.engine.token_log_probs import token_log_probs


@dataclass
class ModelInputs:
    """What GPTModel gets for one micro-batch; `column_offset` is the first padded column kept."""

    input_ids: torch.Tensor  # (rows, kept_len)
    position_ids: torch.Tensor  # (rows, kept_len)
    attention_mask: torch.Tensor  # (rows, 1, kept_len, kept_len) bool, True where attention is masked out
    column_offset: int


def _check_positions(valid: torch.Tensor, position_ids: torch.Tensor) -> None:
    """GPTModel's RoPE counts positions by column: each row's valid tokens must be one run counting 0, 1, 2, ..."""
    columns = torch.arange(valid.shape[1], device=valid.device).expand_as(valid)
    first = torch.where(valid, columns, valid.shape[1]).min(dim=1, keepdim=True).values
    expected = (columns - first)[valid]
    if not torch.equal(position_ids[valid], expected):
        raise ValueError(
            "MegatronEngine needs each row's valid tokens to be one contiguous run with position_ids 0, 1, 2, ... "
            "(left-padded prompt, right-padded response: the rollout's clamp(cumsum(attention_mask) - 1, min=0)); "
            "Megatron's RoPE ignores position_ids, so other layouts would be computed at the wrong positions"
        )


def model_inputs(tensors: TensorDict, strip_padding: bool) -> ModelInputs:
    """GPTModel's inputs for a padded micro-batch, without the all-padding columns when `strip_padding`."""
    valid = tensors["attention_mask"].bool()
    _check_positions(valid, tensors["position_ids"])
    start, stop = 0, valid.shape[1]
    if strip_padding:
        any_valid = valid.any(dim=0).nonzero().flatten()
        if len(any_valid) == 0:
            raise ValueError("use_remove_padding: a micro-batch has no valid token (attention_mask all 0)")
        start, stop = int(any_valid[0]), int(any_valid[-1]) + 1
    valid = valid[:, start:stop]
    length = stop - start
    causal = torch.ones(length, length, dtype=torch.bool, device=valid.device).tril()
    allowed = causal.unsqueeze(0) & valid.unsqueeze(1)  # (rows, query, key)
    return ModelInputs(
        input_ids=tensors["input_ids"][:, start:stop].contiguous(),
        position_ids=tensors["position_ids"][:, start:stop].contiguous(),
        attention_mask=(~allowed).unsqueeze(1),
        column_offset=start,
    )


def _sources(tensors: TensorDict, column_offset: int, kept_len: int) -> torch.Tensor:
    """For each response token, the kept column whose output predicts / values it: (rows, response_len).

    Columns cut away hold padding only, so the tokens that point there are masked out; they are clamped inside.
    """
    seq_len = tensors["input_ids"].shape[1]
    response_len = tensors["responses"].shape[1]
    columns = torch.arange(seq_len - response_len - 1, seq_len - 1, device=tensors["input_ids"].device)
    columns = (columns - column_offset).clamp(0, kept_len - 1)
    return columns.expand(tensors["input_ids"].shape[0], -1)


def causal_lm_outputs(
    logits: torch.Tensor,
    tensors: TensorDict,
    column_offset: int,
    vocab_size: int,
    temperature: float,
    calculate_entropy: bool,
) -> dict[str, torch.Tensor]:
    """log_probs (and entropy) of the responses, (rows, response_len), 0 where the response mask is 0.

    logits: (rows, kept_len, padded_vocab), gathered over TP; the padded vocabulary rows are dropped before the
    softmax.
    """
    mask = response_mask_of(tensors).bool()
    sources = _sources(tensors, column_offset, logits.shape[1])
    picked = logits[:, :, :vocab_size].gather(
        1, sources.unsqueeze(-1).expand(-1, -1, vocab_size))  # (rows, response_len, vocab)
    log_probs, entropy = token_log_probs(picked, tensors["responses"], temperature, calculate_entropy)
    outputs = {"log_probs": torch.where(mask, log_probs, 0.0)}
    if entropy is not None:
        outputs["entropy"] = torch.where(mask, entropy, 0.0)
    return outputs


def value_outputs(per_token: torch.Tensor, tensors: TensorDict, column_offset: int) -> dict[str, torch.Tensor]:
    """values (rows, response_len) from the value head's output (rows, kept_len, 1), 0 where masked."""
    mask = response_mask_of(tensors).bool()
    values = per_token[..., 0].float().gather(1, _sources(tensors, column_offset, per_token.shape[1]))
    return {"values": torch.where(mask, values, 0.0)}


def padded_to(inputs: ModelInputs, rows: int, length: int) -> ModelInputs:
    """`inputs` grown to (rows, length) with fully masked padding (the extra outputs are cut off again)."""
    extra_rows, extra_cols = rows - inputs.input_ids.shape[0], length - inputs.input_ids.shape[1]
    if extra_rows == 0 and extra_cols == 0:
        return inputs
    pad = torch.nn.functional.pad
    return ModelInputs(
        input_ids=pad(inputs.input_ids, (0, extra_cols, 0, extra_rows)),
        position_ids=pad(inputs.position_ids, (0, extra_cols, 0, extra_rows)),
        attention_mask=pad(inputs.attention_mask, (0, extra_cols, 0, extra_cols, 0, 0, 0, extra_rows), value=True),
        column_offset=inputs.column_offset,
    )
