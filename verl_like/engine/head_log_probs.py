"""Token log-probs (and entropy) straight from the last hidden states: the LM head applied a chunk of tokens at a
time, so a micro-batch's `(tokens, vocab)` logits never exist whole.

With a 151,936-word vocabulary the logits and their gradient cost 2 x V x 2 bytes = 594 KiB per response token in
bf16, most of what a packed micro-batch holds under gradient checkpointing (a 0.5B layer input is 1.8 KiB a
layer): a 64k-token micro-batch spends 37 GiB on them. Here the forward keeps only the head's input, the labels
and two floats a token (log-normaliser, entropy); the backward recomputes each chunk's logits, turns them into
their gradient (engine/token_log_probs.py's kernels on CUDA) and folds that into the input's and the weight's
gradients at once. Cost: the head's matmul runs once more (recomputation); memory: one chunk's logits and
gradient (CHUNK_BYTES each) plus a float32 weight-gradient accumulator.

`head_logits_hook` swaps the model's output-embedding forward for this while a forward runs (the HF causal LMs
compute `self.lm_head(hidden[:, keep])` and return it as `logits`), so FSDP2 sees the head weight used inside its
root module's forward, as before. A model that changes the head's output before returning it (Gemma 2's
soft-capping) is detected on its first micro-batch and keeps the plain path. `VERL_LIKE_CHUNKED_HEAD`: `auto`
(default: CUDA with the fused log-prob kernels), `1` (also on CPU: tests), `0` (never).
"""

from __future__ import annotations

import contextlib
import logging
import os
import weakref
from collections.abc import Iterator

import torch
from torch import nn

from verl_like.engine.token_log_probs import fused_log_probs_enabled, log_prob_grad, log_prob_stats

logger = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 30  # one chunk's logits (and, in the backward, their gradient beside them)
_TRANSFORMED_HEADS: weakref.WeakSet[nn.Module] = weakref.WeakSet()  # models whose head output is post-processed


def chunked_head_enabled(device: torch.device) -> bool:
    """Whether micro-batches on `device` take the chunked head (VERL_LIKE_CHUNKED_HEAD, see the module doc)."""
    mode = os.environ.get("VERL_LIKE_CHUNKED_HEAD", "auto")
    if mode not in ("auto", "0", "1"):
        raise ValueError(f"VERL_LIKE_CHUNKED_HEAD={mode!r} is not one of auto, 0, 1")
    if mode != "auto":
        return mode == "1"
    return device.type == "cuda" and fused_log_probs_enabled()


def chunk_rows(vocab: int, itemsize: int) -> int:
    """Tokens per chunk: CHUNK_BYTES of logits, at least 256."""
    return max(256, CHUNK_BYTES // (vocab * itemsize))


def plain_output_head(model: nn.Module) -> nn.Linear | None:
    """The model's output embedding when it is a plain bias-free nn.Linear the chunked head can stand in for
    (a LoRA-wrapped or biased head, or one whose output the model post-processes, is not); else None."""
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if getter is not None else None
    if type(head) is not nn.Linear or head.bias is not None or model in _TRANSFORMED_HEADS:
        return None
    return head


def head_token_log_probs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temperature: float,
                         calculate_entropy: bool, chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(label), entropy — zeros when not `calculate_entropy`), float32 `(tokens,)`, of softmax(hidden @
    weight.T / temperature); hidden `(tokens, hidden)`, weight `(vocab, hidden)`, labels `(tokens,)`.
    Differentiable in `hidden` and `weight`; `chunk` tokens at a time (default `chunk_rows`)."""
    if hidden.dim() != 2 or labels.shape != hidden.shape[:1]:
        raise ValueError(f"head_token_log_probs: hidden {tuple(hidden.shape)} must be (tokens, hidden) and labels "
                         f"{tuple(labels.shape)} (tokens,)")
    rows = chunk or chunk_rows(weight.shape[0], weight.element_size())
    return _ChunkedHeadLogProbs.apply(hidden, weight, labels, float(temperature), calculate_entropy, rows)


class _ChunkedHeadLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, temperature, calculate_entropy, rows):
        count = hidden.shape[0]
        log_probs = torch.empty(count, dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(log_probs)
        entropy = torch.zeros_like(log_probs)
        for start in range(0, count, rows):
            part = slice(start, min(start + rows, count))
            logits = hidden[part] @ weight.T
            lp, norm, ent = log_prob_stats(logits, labels[part], temperature, calculate_entropy)
            log_probs[part], lse[part] = lp, norm
            if ent is not None:
                entropy[part] = ent
            del logits
        ctx.save_for_backward(hidden, weight, labels, lse, entropy)
        ctx.temperature, ctx.calculate_entropy, ctx.rows = temperature, calculate_entropy, rows
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy):
        hidden, weight, labels, lse, entropy = ctx.saved_tensors
        use_entropy = ctx.calculate_entropy and grad_entropy is not None
        if grad_log_probs is None and not use_entropy:
            return None, None, None, None, None, None
        if grad_log_probs is None:
            grad_log_probs = lse.new_zeros(lse.shape)
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        # float32 sum over chunks (each chunk's own matmul accumulates in float32 already)
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
        for start in range(0, hidden.shape[0], ctx.rows):
            part = slice(start, min(start + ctx.rows, hidden.shape[0]))
            logits = hidden[part] @ weight.T
            grad_logits = log_prob_grad(logits, labels[part], grad_log_probs[part],
                                        grad_entropy[part] if use_entropy else None, lse[part],
                                        entropy[part] if use_entropy else None, ctx.temperature)
            del logits
            if need_hidden:
                grad_hidden[part] = grad_logits @ weight
            if need_weight:
                grad_weight += (grad_logits.T @ hidden[part]).float()
            del grad_logits
        return (grad_hidden, grad_weight.to(weight.dtype) if need_weight else None, None, None, None, None)


@contextlib.contextmanager
def head_logits_hook(model: nn.Module, head: nn.Linear, labels: torch.Tensor, temperature: float,
                     calculate_entropy: bool) -> Iterator[list[torch.Tensor]]:
    """While active, `head` (the model's output embedding) returns `(1, tokens, 2)`: log p(labels) and entropy of
    its input `(1, tokens, hidden)` (the hidden states the model keeps, one per label), through
    `head_token_log_probs`. Yields a list that holds the tensor the head returned, to check that the model's
    `logits` are that very tensor (`accept_head_output`)."""
    produced: list[torch.Tensor] = []

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        if hidden.dim() != 3 or hidden.shape[0] != 1 or hidden.shape[1] != labels.shape[0]:
            raise ValueError(f"chunked LM head: expected the packed row's kept hidden states (1, {labels.shape[0]}, "
                             f"hidden), got {tuple(hidden.shape)}")
        log_probs, entropy = head_token_log_probs(hidden[0], head.weight, labels, temperature, calculate_entropy)
        produced.append(torch.stack([log_probs, entropy], dim=-1).unsqueeze(0))
        return produced[-1]

    head.forward = forward  # an instance attribute shadows the class's forward for this call only
    try:
        yield produced
    finally:
        del head.forward


def accept_head_output(model: nn.Module, logits: torch.Tensor, produced: list[torch.Tensor]) -> bool:
    """Whether the model returned the chunked head's output untouched; if not, the model is remembered and keeps
    the plain head from now on (logged once)."""
    if len(produced) == 1 and logits is produced[0]:
        return True
    _TRANSFORMED_HEADS.add(model)
    logger.warning("%s changes its LM head's output before returning it (e.g. logit soft-capping): its log-probs "
                   "take the plain head (whole logits) from now on", type(model).__name__)
    return False
