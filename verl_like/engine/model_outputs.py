"""One micro-batch through the model: padded (the reference) or packed, to log-probs / entropy, values or scores.

Packed means the micro-batch's valid tokens concatenated into one row `(1, total_tokens)` with position ids that
restart at 0 for every sequence and no attention mask. transformers (>= 4.56; read in 5.19's masking_utils and
modeling_flash_attention_utils) detects such rows from the position ids and keeps sequences apart: sdpa and eager
get a block-diagonal causal mask, flash_attention_2 a varlen call with cu_seqlens taken where position ids are 0.
A packed causal-LM micro-batch takes its log-probs from the chunked LM head on CUDA (engine/head_log_probs.py: the
whole logits never exist); the padded path and the teacher top-k (distillation) keep the plain head.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from tensordict import TensorDict
from torch import nn

from verl_like.engine.head_log_probs import (
    accept_head_output, chunked_head_enabled, head_logits_hook, plain_output_head,
)
from verl_like.engine.token_log_probs import token_log_probs
from verl_like.engine import vision


# A causal-LM batch holding this key `(batch, response_len, k)` of token ids (a teacher's top-k) also gets
# "topk_log_probs" `(batch, response_len, k)`: the model's log-probs of those tokens at each response position.
TOPK_IDS_KEY = "teacher_topk_ids"


@dataclass
class _PackedLayout:
    """Where each padded `(row, column)` token sits in the packed row."""

    input_ids: torch.Tensor  # (1, total_tokens)
    position_ids: torch.Tensor  # (1, total_tokens)
    flat_index: torch.Tensor  # (batch, seq_len): packed position of each token, -1 for padding
    last_index: torch.Tensor  # (batch,): packed position of each sequence's last valid token


def response_mask_of(tensors: TensorDict) -> torch.Tensor:
    """`response_mask` if the batch has one, else the response part of the attention mask; (batch, response_len)."""
    if "response_mask" in tensors.keys():
        return tensors["response_mask"]
    response_len = tensors["responses"].shape[1]
    return tensors["attention_mask"][:, -response_len:]


def pack(tensors: TensorDict) -> _PackedLayout:
    """The packed layout of a padded micro-batch; checks position ids count 0, 1, 2... over each sequence."""
    valid = tensors["attention_mask"].bool()
    lengths = valid.sum(dim=1)
    if bool((lengths == 0).any()):
        raise ValueError("use_remove_padding: a sequence has no valid token (attention_mask all 0); drop it first")
    total = int(lengths.sum())
    device = valid.device
    flat_index = torch.full(valid.shape, -1, dtype=torch.long, device=device)
    flat_index[valid] = torch.arange(total, device=device)
    starts = torch.cumsum(lengths, dim=0) - lengths
    position_ids = tensors["position_ids"][valid]
    expected = torch.arange(total, device=device) - torch.repeat_interleave(starts, lengths)
    if not torch.equal(position_ids, expected):
        raise ValueError(
            "use_remove_padding needs position_ids that count 0, 1, 2, ... over each sequence's valid tokens "
            "(the rollout's clamp(cumsum(attention_mask) - 1, min=0)); got other values, so packed sequences "
            "could not be told apart. Fix the position ids or set use_remove_padding=False"
        )
    return _PackedLayout(
        input_ids=tensors["input_ids"][valid].unsqueeze(0),
        position_ids=position_ids.unsqueeze(0),
        flat_index=flat_index,
        last_index=starts + lengths - 1,
    )


def _response_sources(tensors: TensorDict, layout: _PackedLayout | None) -> torch.Tensor:
    """For each response token, the position whose output predicts / values it: (batch, response_len).

    Padded: a column of the padded sequence; packed: a position in the packed row (-1 where that is padding).
    """
    seq_len = tensors["input_ids"].shape[1]
    response_len = tensors["responses"].shape[1]
    columns = torch.arange(seq_len - response_len - 1, seq_len - 1, device=tensors["input_ids"].device)
    if layout is None:
        return columns.expand(tensors["input_ids"].shape[0], -1)
    return layout.flat_index[:, columns]


def _checked_packed_sources(tensors: TensorDict, layout: _PackedLayout, mask: torch.Tensor) -> torch.Tensor:
    sources = _response_sources(tensors, layout)[mask]
    if bool((sources < 0).any()):
        raise ValueError(
            "response_mask marks a response token whose preceding position has attention_mask 0; the masks "
            "disagree (a masked-in response token must follow a valid token)"
        )
    return sources


def _topk_log_probs(logits: torch.Tensor, token_ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """log p at `token_ids` (..., k) under softmax(logits / temperature), in float32; logits (..., vocab)."""
    scaled = logits.float() / temperature
    return scaled.gather(-1, token_ids) - torch.logsumexp(scaled, dim=-1, keepdim=True)


def _scatter(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`values` (one per True entry of `mask`, row-major) placed into zeros shaped like `mask`."""
    out = values.new_zeros(mask.shape)
    out[mask] = values
    return out


def _scatter_k(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`values` (one row of k per True entry of `mask`) placed into zeros shaped `(*mask.shape, k)`."""
    out = values.new_zeros((*mask.shape, values.shape[-1]))
    out[mask] = values
    return out


@contextlib.contextmanager
def _per_token_scores(model: nn.Module) -> Iterator[None]:
    """While active, a sequence classifier returns its head's per-token output `(rows, seq_len, 1)` as `logits`.

    HF's own pooling picks the last token that is not pad_token_id, which is wrong when pad == eos and meaningless
    for a packed row; the engine pools at the last valid token itself. The swap happens inside the model's forward
    (a prepended forward hook, before FSDP's post-forward hook), so the loss reaches the parameters through the
    model's output, where FSDP hooks its backward all-gather.
    """
    captured: list[torch.Tensor] = []
    head_handle = model.score.register_forward_hook(lambda _m, _inputs, output: captured.append(output))

    def swap(_module: nn.Module, _inputs: tuple, output):
        output.logits = captured[-1]
        return output

    model_handle = model.register_forward_hook(swap, prepend=True)
    try:
        yield
    finally:
        head_handle.remove()
        model_handle.remove()


def _forward(model: nn.Module, tensors: TensorDict, layout: _PackedLayout | None, **kwargs):
    """The model's output on the padded micro-batch, or on its packed row when `layout` is given; an image
    batch's pixels (engine/vision.py) go with the padded rows they belong to, and the M-RoPE families' 3-D
    positions replace the text positions."""
    pixels = vision.model_inputs(tensors)
    if layout is None:
        position_ids = pixels.pop("position_ids", tensors["position_ids"])
        return model(
            input_ids=tensors["input_ids"],
            attention_mask=tensors["attention_mask"],
            position_ids=position_ids,
            use_cache=False,
            **pixels,
            **kwargs,
        )
    if pixels:
        raise ValueError(
            "use_remove_padding packs the micro-batch into one row, which image prompts do not support yet (the "
            "model matches image features to rows); set actor_rollout_ref.model.use_remove_padding=false"
        )
    return model(input_ids=layout.input_ids, position_ids=layout.position_ids, use_cache=False, **kwargs)


def _causal_lm_outputs(
    model: nn.Module, tensors: TensorDict, layout: _PackedLayout | None, temperature: float, calculate_entropy: bool
) -> dict[str, torch.Tensor]:
    mask = response_mask_of(tensors).bool()
    responses = tensors["responses"]
    if layout is None:
        logits = _forward(model, tensors, None, logits_to_keep=responses.shape[1] + 1).logits[:, :-1]
        log_probs, entropy = token_log_probs(logits, responses, temperature, calculate_entropy)
        # torch.where, not a product: padding positions may hold inf/nan that must not leak into sums.
        outputs = {"log_probs": torch.where(mask, log_probs, 0.0)}
        if entropy is not None:
            outputs["entropy"] = torch.where(mask, entropy, 0.0)
        if TOPK_IDS_KEY in tensors.keys():
            topk = _topk_log_probs(logits, tensors[TOPK_IDS_KEY], temperature)
            outputs["topk_log_probs"] = torch.where(mask.unsqueeze(-1), topk, 0.0)
        return outputs
    sources = _checked_packed_sources(tensors, layout, mask)
    labels = responses[mask]
    head = plain_output_head(model) if TOPK_IDS_KEY not in tensors.keys() else None
    if head is not None and chunked_head_enabled(labels.device):
        with head_logits_hook(model, head, labels, temperature, calculate_entropy) as produced:
            stacked = _forward(model, tensors, layout, logits_to_keep=sources).logits
        if accept_head_output(model, stacked, produced):
            outputs = {"log_probs": _scatter(stacked[0, :, 0], mask)}
            if calculate_entropy:
                outputs["entropy"] = _scatter(stacked[0, :, 1], mask)
            return outputs
    logits = _forward(model, tensors, layout, logits_to_keep=sources).logits[0]
    log_probs, entropy = token_log_probs(logits, labels, temperature, calculate_entropy)
    outputs = {"log_probs": _scatter(log_probs, mask)}
    if entropy is not None:
        outputs["entropy"] = _scatter(entropy, mask)
    if TOPK_IDS_KEY in tensors.keys():
        ids = tensors[TOPK_IDS_KEY]
        topk = _topk_log_probs(logits, ids[mask], temperature)
        outputs["topk_log_probs"] = _scatter_k(topk, mask)
    return outputs


def _value_outputs(model: nn.Module, tensors: TensorDict, layout: _PackedLayout | None) -> dict[str, torch.Tensor]:
    mask = response_mask_of(tensors).bool()
    per_token = _forward(model, tensors, layout).logits[..., 0].float()  # (batch, seq_len) or (1, total_tokens)
    if layout is None:
        values = per_token.gather(1, _response_sources(tensors, None))
        return {"values": torch.where(mask, values, 0.0)}
    return {"values": _scatter(per_token[0, _checked_packed_sources(tensors, layout, mask)], mask)}


def _score_outputs(model: nn.Module, tensors: TensorDict, layout: _PackedLayout | None) -> dict[str, torch.Tensor]:
    with _per_token_scores(model):
        per_token = _forward(model, tensors, layout).logits[..., 0].float()  # (batch, seq_len) or (1, total_tokens)
    if layout is None:
        attention_mask = tensors["attention_mask"]
        columns = torch.arange(attention_mask.shape[1], device=attention_mask.device)
        last = (columns * attention_mask.bool()).argmax(dim=1)
        return {"scores": per_token.gather(1, last.unsqueeze(1)).squeeze(1)}
    return {"scores": per_token[0, layout.last_index]}


def micro_batch_outputs(
    model: nn.Module,
    model_kind: str,
    tensors: TensorDict,
    packed: bool,
    temperature: float = 1.0,
    calculate_entropy: bool = False,
) -> dict[str, torch.Tensor]:
    """The model outputs of one micro-batch (keys and shapes in verl_like.engine.base's module doc)."""
    layout = pack(tensors) if packed else None
    if model_kind == "causal_lm":
        return _causal_lm_outputs(model, tensors, layout, temperature, calculate_entropy)
    if model_kind == "value":
        return _value_outputs(model, tensors, layout)
    if model_kind == "sequence_classifier":
        return _score_outputs(model, tensors, layout)
    raise ValueError(f"model_kind={model_kind!r} is not one of ('causal_lm', 'value', 'sequence_classifier')")
