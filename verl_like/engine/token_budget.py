"""Token budgets sized from free device memory: an activation estimate per token from the model's shape.

A null budget key (config/token_budget.py says which passes) is sized on each rank once every model of the
process is in place, and the group takes the smallest, so every rank plans its micro-batches alike:

    budget = min((free bytes - bytes still to come) x SAFETY_FRACTION, device bytes x ACTIVATION_SHARE)
             / bytes per token,
             rounded down to a multiple of 1,024, clamped to [MIN_BUDGET, MAX_BUDGET], never below the longest
             sequence (one sample must fit whatever the estimate says)

ACTIVATION_SHARE caps a micro-batch's (estimated) activations at a tenth of the device even when more is free:
past a few ten thousand tokens a bigger micro-batch barely speeds the pass up (0.5B update on an H200: 1.77 s at
32k tokens, 1.61 s at 64k; a 1.5B staleness-1 step on an H100 beside its vLLM server, bf16 weights: 6.19 s at 32,768
tokens against 6.18 s at the 68,608 a fifth of the device gave, peak 38.4 against 44.0 GiB), while the memory it
takes sets the run's peak, which should not exceed what a peer framework needs for the same workload (issue #30:
TRL's GRPO, whose vLLM keeps 30 % of the device throughout; 41.0 GiB at that 1.5B workload).
A budget key set to a number is used as it is.

Bytes per token (`bytes_per_token`), for packed rows in the compute dtype (c bytes an element; h hidden, i
intermediate, q / kv query / key-value widths, L layers, V vocabulary):
- the update keeps, per layer, what its backward reads: the two norms' inputs and outputs, q, k, v, the attention
  output, the MLP's gate, up and product (and silu(gate) without the fused layers): 6h + 2q + 2kv + 3i (+ i). With
  gradient checkpointing only each layer's input (h) is kept, plus one layer's activations and their gradients
  while it is recomputed;
- the logits of every token (an upper bound: only response tokens get logits) and, in the update, their
  gradient: 2 x V x c with the fused log-prob kernels (engine/token_log_probs.py, CUDA), about 6 x V x 4 bytes
  more with the plain torch path (its float32 copy, softmax and gather's gradient); none with the chunked LM head
  (engine/head_log_probs.py), whose chunk of logits is a fixed cost counted with the bytes still to come;
- a forward without gradients (the log-prob passes) keeps one layer's activations at a time and the logits.
Bytes still to come (`pending_bytes`): what the pass will allocate beyond what is resident when free memory is
read: AdamW's two moments and the gradients (the optimizer state is created at the first step), FSDP's unsharded
parameters (the root and two layers in flight; the whole model without reshard_after_forward) and one layer's
unsharded gradient; the chunked head's workspace (one chunk of logits and, in the update, its gradient, the
head's float32 gradient and one chunk's contribution to it). The estimate is deliberately high; the GPU test
(tests/gpu/test_token_budget_gpu.py) checks one forward/backward at the sized budget against the free memory it was
sized from (with the chunked head on the H100 of 2026-12-06: budget 21,504 from 5 GiB free, update peak 3.24 GiB).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from verl_like.shapes.decoder import DecoderShape

logger = logging.getLogger(__name__)

MIN_BUDGET = 4096
MAX_BUDGET = 131072
BUDGET_MULTIPLE = 1024
SAFETY_FRACTION = 0.7  # of the free bytes: allocator fragmentation, NCCL buffers, kernels' workspaces
ACTIVATION_SHARE = 0.1  # of the device's total bytes: the most a micro-batch's activations may take (module doc)


@dataclass(frozen=True)
class ActivationModel:
    """What the bytes per token depend on besides the shape: `compute_bytes` (2 for bf16, 4 for fp32),
    `gradient_checkpointing`, `fused_layers` (engine/fused_layers.py), `fused_log_probs` (the Triton log-prob
    kernels, on CUDA unless VERL_LIKE_FUSED_LOG_PROBS=0), `chunked_head` (log-probs from the hidden states chunk
    by chunk, engine/head_log_probs.py: no per-token logits)."""

    compute_bytes: int
    gradient_checkpointing: bool
    fused_layers: bool
    fused_log_probs: bool
    chunked_head: bool = False


def _layer_elements(shape: DecoderShape, fused_layers: bool) -> int:
    h, i = shape.hidden_size, shape.intermediate_size
    q = shape.num_attention_heads * shape.head_dim
    kv = shape.num_key_value_heads * shape.head_dim
    return 6 * h + 2 * q + 2 * kv + (3 if fused_layers else 4) * i


def bytes_per_token(shape: DecoderShape, model: ActivationModel, training: bool) -> int:
    """Peak activation bytes one token adds to a micro-batch of the pass (training: forward and backward)."""
    c = model.compute_bytes
    layer = _layer_elements(shape, model.fused_layers) * c
    vocab = shape.vocab_size
    logits = vocab * c * (2 if training else 1)
    if model.chunked_head:
        logits = 0
    elif not model.fused_log_probs:
        logits += 6 * vocab * 4 if training else 2 * vocab * 4
    if not training:
        return layer + logits
    if model.gradient_checkpointing:
        kept = shape.num_hidden_layers * shape.hidden_size * c + 2 * layer  # inputs; one layer and its gradients
    else:
        kept = shape.num_hidden_layers * layer + layer
    return kept + logits


def _parameters(shape: DecoderShape) -> tuple[int, int]:
    """(parameters of one decoder layer, of the root: embeddings, final norm and the head if untied)."""
    h = shape.hidden_size
    layer = shape.linear_params_per_layer + 2 * h
    root = shape.vocab_size * h * (1 if shape.tie_word_embeddings else 2) + h
    return layer, root


@dataclass(frozen=True)
class ResidentState:
    """One rank's engine state that decides what a pass still allocates (read with the engine onloaded):
    `trainable_local` (trainable parameter elements of this rank's shards), `master_bytes` (bytes of a stored
    element, AdamW's moments alike), `optimizer_allocated` (AdamW's state exists already: after a step or a
    resumed checkpoint), `optimizer_on_device` (false under offload_policy: gradients and optimizer state live in
    CPU memory), `optimizer_offload` (the state leaves the device after each update, so the log-prob passes do
    not see it), `reshard_after_forward`, `reduce_bytes` (an unsharded gradient's element)."""

    trainable_local: int
    master_bytes: int
    optimizer_allocated: bool
    optimizer_on_device: bool
    optimizer_offload: bool
    reshard_after_forward: bool
    reduce_bytes: int


def pending_bytes(shape: DecoderShape, state: ResidentState, compute_bytes: int, training: bool,
                  chunked_head: bool = False) -> int:
    """Bytes the pass allocates besides activations that free memory does not reflect yet."""
    layer, root = _parameters(shape)
    head_workspace = _chunked_head_workspace(shape, compute_bytes, training) if chunked_head else 0
    if state.reshard_after_forward:
        unsharded = (root + 2 * layer) * compute_bytes
    else:
        unsharded = (root + shape.num_hidden_layers * layer) * compute_bytes
    pending = unsharded + head_workspace
    if training:
        pending += (root + layer) * state.reduce_bytes  # unsharded gradients before their reduce-scatter
    if not state.optimizer_on_device or state.trainable_local == 0:
        return pending
    moments = 0 if state.optimizer_allocated else 2 * state.trainable_local * state.master_bytes
    if training:
        return pending + state.trainable_local * state.master_bytes + moments  # the sharded gradients, AdamW
    return pending + (0 if state.optimizer_offload else moments)  # made by the first update, kept afterwards


def _chunked_head_workspace(shape: DecoderShape, compute_bytes: int, training: bool) -> int:
    """One chunk of logits (and in the update its gradient, the head's float32 gradient and one chunk's
    contribution to it): engine/head_log_probs.py."""
    from verl_like.engine.head_log_probs import CHUNK_BYTES

    if not training:
        return CHUNK_BYTES
    head = shape.vocab_size * shape.hidden_size
    return 2 * CHUNK_BYTES + head * (4 + compute_bytes)


def size_budget(free_bytes: int, pending: int, per_token: int, longest_sequence: int,
                safety: float = SAFETY_FRACTION, device_bytes: int | None = None) -> int:
    """The budget for `free_bytes` of free device memory out of `device_bytes` in all (None: no share cap; see
    the module doc); `per_token` > 0."""
    usable = max(0, free_bytes - pending) * safety
    if device_bytes is not None:
        usable = min(usable, device_bytes * ACTIVATION_SHARE)
    budget = int(usable // per_token) // BUDGET_MULTIPLE * BUDGET_MULTIPLE
    budget = min(MAX_BUDGET, max(MIN_BUDGET, budget))
    return max(budget, longest_sequence)


def resident_state(engine) -> ResidentState:
    """The ResidentState of an FSDPEngine (its parameters onloaded)."""
    from torch.distributed.tensor import DTensor

    config = engine.config
    params = list(engine.model.parameters())
    trainable = sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in params if p.requires_grad)
    optimizer = engine.optimizer
    return ResidentState(
        trainable_local=trainable if optimizer is not None else 0,
        master_bytes=params[0].dtype.itemsize if params else 4,
        optimizer_allocated=optimizer is not None and len(optimizer.state) > 0,
        optimizer_on_device=not config.offload_policy,
        optimizer_offload=config.optimizer_offload,
        reshard_after_forward=config.reshard_after_forward,
        reduce_bytes=_dtype_bytes(config.reduce_dtype or config.dtype),
    )


def _dtype_bytes(name: str) -> int:
    return 2 if name == "bfloat16" else 4


def free_device_bytes() -> int:
    """Bytes this process could still allocate on its CUDA device: the device's free memory plus what PyTorch's
    allocator holds unused (after returning its cache)."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, _total = torch.cuda.mem_get_info()
    return int(free + torch.cuda.memory_reserved() - torch.cuda.memory_allocated())


def device_total_bytes() -> int:
    """The CUDA device's total memory."""
    import torch

    return int(torch.cuda.mem_get_info()[1])


def activation_model(engine) -> ActivationModel:
    """The ActivationModel of an FSDPEngine on this process's device."""
    import torch

    from verl_like.engine.head_log_probs import chunked_head_enabled, plain_output_head
    from verl_like.engine.token_log_probs import fused_log_probs_enabled

    config = engine.config
    chunked = (config.use_remove_padding and config.model_kind == "causal_lm"
               and chunked_head_enabled(torch.device("cuda")) and plain_output_head(engine.model) is not None)
    return ActivationModel(
        compute_bytes=_dtype_bytes(config.param_dtype or config.dtype),
        gradient_checkpointing=config.gradient_checkpointing,
        fused_layers=config.fused_kernels,
        fused_log_probs=fused_log_probs_enabled(),
        chunked_head=chunked,
    )


def budgets_for(passes: Sequence[str], shape: DecoderShape, model: ActivationModel, state: ResidentState,
                free_bytes: int, longest_sequence: int, device_bytes: int | None = None) -> dict[str, int]:
    """Each pass's budget on one rank (`passes` from config/token_budget.py; the update trains, the others do not);
    `device_bytes`: the device's total memory, for the ACTIVATION_SHARE cap (None: no cap)."""
    from verl_like.config.token_budget import UPDATE

    budgets = {}
    for name in passes:
        training = name == UPDATE
        per_token = bytes_per_token(shape, model, training)
        pending = pending_bytes(shape, state, model.compute_bytes, training, model.chunked_head)
        budgets[name] = size_budget(free_bytes, pending, per_token, longest_sequence, device_bytes=device_bytes)
        logger.info("token budget %s: %d (free %.1f GiB, still to come %.1f GiB, %.0f KiB per token)", name,
                    budgets[name], free_bytes / 2**30, pending / 2**30, per_token / 1024)
    return budgets


def size_engine_budgets(passes: Sequence[str], actor_engine, ref_engine, longest_sequence: int, timeout_s: float,
                        role: str) -> dict[str, int]:
    """Each pass's budget, the same on every rank of the default group: sized from this device's free memory with
    the actor's (and the reference's) FSDPEngine onloaded, then the smallest over the ranks (`min_over_ranks`)."""
    if not passes:
        return {}
    engines = [actor_engine] + ([ref_engine] if ref_engine is not None else [])
    for engine in engines:
        engine.onload()
    try:
        shape = DecoderShape.from_hf_config(actor_engine.model.config)
        budgets = budgets_for(passes, shape, activation_model(actor_engine), resident_state(actor_engine),
                              free_device_bytes(), longest_sequence, device_total_bytes())
    finally:
        for engine in engines:
            engine.offload()
    agreed = min_over_ranks([budgets[name] for name in passes], None, timeout_s, role)
    return dict(zip(passes, agreed))


def agree(per_rank: Sequence[Sequence[int]]) -> list[int]:
    """The budgets every rank uses: each pass's smallest over the ranks (per_rank: one list of budgets per rank)."""
    if not per_rank:
        raise ValueError("agree: no rank's budgets")
    return [min(values) for values in zip(*per_rank, strict=True)]


def min_over_ranks(budgets: list[int], group, timeout_s: float, role: str) -> list[int]:
    """`agree` over the ranks of `group` (one all_reduce MIN of CPU tensors); raises after `timeout_s` naming
    `role`, the rank and what to check."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return list(budgets)
    values = torch.tensor(budgets, dtype=torch.long)
    work = dist.all_reduce(values, op=dist.ReduceOp.MIN, group=group, async_op=True)
    try:
        work.wait(timeout=datetime.timedelta(seconds=timeout_s))
    except RuntimeError as err:
        raise TimeoutError(
            f"{role}: rank {dist.get_rank()} waited {timeout_s:g} s for the other ranks' token budgets (sized from "
            f"free memory at start-up); a rank probably failed while building its models ({err})"
        ) from err
    return [int(v) for v in values.tolist()]
