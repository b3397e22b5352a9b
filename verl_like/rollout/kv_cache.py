"""How big the rollout engine's KV cache is: the bytes vLLM gets as `kv_cache_memory_bytes` (None: vLLM sizes it).

vLLM left alone gives its KV cache everything `gpu_memory_utilization` leaves after the weights (about 38 GiB of
an H200 at 0.3 for a 0.5B model), while a rollout never holds more than `max_num_seqs` sequences of
`max_model_len` tokens at once (256 x 640 tokens of a 0.5B model: 1.9 GiB). `rollout.kv_cache_tokens` says how many
tokens' worth to allocate (config/rollout.py):

    request = kv_cache_request(rollout, hf_config, model_path, device)   # None: vLLM sizes the cache
    kv_bytes = kv_cache_bytes(request, rollout.gpu_memory_utilization, device_total_bytes, tp)

where a null key asks for `kv_cache_token_slots` (what the engine can ever hold at once) times
`kv_bytes_per_token` (one TP rank's bytes per cached token), fitted into gpu_memory_utilization (`fitted_kv_bytes`).

The per-token size is that of full attention (2 x layers x KV heads on the rank x head size x dtype bytes), the
layout of vLLM's paged cache for the dense decoders we train; sliding-window layers need no more. Models whose
cache is laid out otherwise (latent attention, state-space or linear-attention layers) get None: vLLM sizes theirs.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from verl_like.config.rollout import RolloutConfig

logger = logging.getLogger(__name__)

KEY = "actor_rollout_ref.rollout.kv_cache_tokens"

# Every per-sequence allowance is rounded up to this many tokens: a multiple of every block size vLLM's attention
# backends use for these models (16 on CUDA by default, 128 on CPU), so no sequence's last block is short.
BLOCK_ROUND = 128
# What the engine keeps beside its weights and KV cache within gpu_memory_utilization: the profiling forward's
# activations, CUDA graphs, sampler buffers, NCCL and cuBLAS workspaces.
RESERVE_FRACTION = 0.15
RESERVE_BYTES = 1 << 30
# The server's flags: vLLM's own, and verl_like.serve's pair that it turns into vLLM's on the server's device.
KV_BYTES_FLAG = "--kv-cache-memory-bytes"
KV_FIT_FLAG = "--kv-cache-fit-bytes"
KV_WEIGHTS_FLAG = "--kv-cache-weight-bytes"
ATTENTION_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}


def kv_cache_token_slots(max_num_seqs: int, max_model_len: int) -> int:
    """Tokens the engine may ever cache at once: `max_num_seqs` sequences of `max_model_len` (each rounded up to
    BLOCK_ROUND), plus one sequence more for the block vLLM keeps aside and prefix-cache churn."""
    per_sequence = math.ceil(max_model_len / BLOCK_ROUND) * BLOCK_ROUND
    return (max_num_seqs + 1) * per_sequence


def dtype_bytes(dtype: str, hf_config: Any) -> int:
    """Bytes per element of the rollout dtype ("auto": the checkpoint's, bfloat16 when it names none)."""
    if dtype == "auto":
        text = _text_config(hf_config)
        name = getattr(text, "dtype", None) or getattr(text, "torch_dtype", None) or "bfloat16"
        dtype = str(name).removeprefix("torch.")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"no element size known for dtype {dtype!r}; one of {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


def kv_bytes_per_token(hf_config: Any, dtype: str, tensor_parallel_size: int = 1) -> int | None:
    """One TP rank's KV-cache bytes per cached token for a full-attention decoder; None when the model's cache is
    laid out otherwise (latent attention, state-space or linear-attention layers) or its config lacks the sizes.
    KV heads are split over the TP ranks, and replicated when there are fewer heads than ranks (as vLLM does)."""
    text = _text_config(hf_config)
    if getattr(text, "kv_lora_rank", None) or any(
            hasattr(text, name) for name in ("mamba_d_state", "ssm_state_size", "linear_num_key_heads")):
        return None
    layer_types = getattr(text, "layer_types", None)
    if layer_types and not set(layer_types) <= ATTENTION_LAYER_TYPES:
        return None
    layers = getattr(text, "num_hidden_layers", None)
    heads = getattr(text, "num_attention_heads", None)
    if not layers or not heads:
        return None
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_size = getattr(text, "head_dim", None) or getattr(text, "hidden_size", 0) // heads
    if not head_size:
        return None
    heads_per_rank = max(1, kv_heads // tensor_parallel_size)
    return 2 * layers * heads_per_rank * head_size * dtype_bytes(dtype, hf_config)


def checkpoint_weight_bytes(model_path: str | os.PathLike, dtype: str, hf_config: Any) -> int:
    """The weights' bytes in the rollout dtype, from the checkpoint's safetensors/bin files and their dtype (a
    vision tower and a tied head counted as stored); 0 when the directory has no weight files."""
    if not Path(model_path).is_dir():
        return 0
    files = [p for p in Path(model_path).iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file()]
    stored = sum(p.stat().st_size for p in files)
    return stored * dtype_bytes(dtype, hf_config) // dtype_bytes("auto", hf_config)


def fitted_kv_bytes(needed: int, weight_bytes: int, gpu_memory_utilization: float, device_bytes: int,
                    tensor_parallel_size: int = 1) -> int | None:
    """`needed` when it fits in what gpu_memory_utilization leaves beside one rank's weights and the engine's
    reserve (RESERVE_FRACTION of its share + RESERVE_BYTES), else what does fit; None when nothing does (vLLM then
    sizes the cache itself, and says what is missing)."""
    share = gpu_memory_utilization * device_bytes
    room = int(share * (1 - RESERVE_FRACTION)) - RESERVE_BYTES - weight_bytes // tensor_parallel_size
    if room <= 0:
        return None
    return min(needed, room)


def _text_config(hf_config: Any) -> Any:
    get_text = getattr(hf_config, "get_text_config", None)
    return get_text() if callable(get_text) else hf_config


@dataclass(frozen=True)
class KVCacheRequest:
    """What the rollout node asks of one TP rank's KV cache: `needed` bytes, exactly (a number of tokens) or, with
    `fit` (null on CUDA), as much of them as gpu_memory_utilization leaves beside `weight_bytes` (one engine's
    weights in the rollout dtype)."""

    needed: int
    weight_bytes: int = 0
    fit: bool = False


def kv_cache_request(rollout: RolloutConfig, hf_config: Any, model_path: str | os.PathLike,
                     device: str) -> KVCacheRequest | None:
    """The request `rollout.kv_cache_tokens` makes on `device` ("cuda"/"cpu"); None: vLLM sizes the cache
    (-1; null on CPU; null for a model whose cache is not full attention). A number for such a model raises."""
    tokens = rollout.kv_cache_tokens
    if tokens == -1 or (tokens is None and device != "cuda"):
        return None
    per_token = kv_bytes_per_token(hf_config, rollout.dtype, rollout.tensor_model_parallel_size)
    if per_token is None:
        if tokens is not None:
            raise ValueError(
                f"{KEY}={tokens}, but the model's KV cache is not plain attention (latent attention, state-space "
                f"or linear-attention layers) and its per-token size is not known here; set {KEY}=null or -1 "
                "(vLLM sizes it from gpu_memory_utilization)")
        logger.info("%s=auto: vLLM sizes the KV cache (the model's cache is not plain attention)", KEY)
        return None
    if tokens is None:
        slots = kv_cache_token_slots(rollout.max_num_seqs, rollout.engine_max_model_len)
        return KVCacheRequest(slots * per_token, checkpoint_weight_bytes(model_path, rollout.dtype, hf_config),
                              fit=True)
    # One block-rounded sequence's worth more than asked: vLLM keeps one block aside.
    return KVCacheRequest((math.ceil(tokens / BLOCK_ROUND) + 1) * BLOCK_ROUND * per_token)


def kv_cache_bytes(request: KVCacheRequest | None, gpu_memory_utilization: float, device_bytes: int,
                   tensor_parallel_size: int = 1) -> int | None:
    """vLLM's kv_cache_memory_bytes for `request` on a device of `device_bytes` (None: vLLM sizes it)."""
    if request is None:
        return None
    if not request.fit:
        return request.needed
    fitted = fitted_kv_bytes(request.needed, request.weight_bytes, gpu_memory_utilization, device_bytes,
                             tensor_parallel_size)
    if fitted is None:
        logger.warning("%s=auto: the weights (%.1f GiB) leave no room in gpu_memory_utilization=%g of %.1f GiB; "
                       "vLLM sizes the KV cache", KEY, request.weight_bytes / 2**30, gpu_memory_utilization,
                       device_bytes / 2**30)
    else:
        logger.info("%s=auto: %.2f GiB of KV cache per rank (%s)", KEY, fitted / 2**30,
                    "all the engine can hold at once" if fitted == request.needed
                    else f"what gpu_memory_utilization={gpu_memory_utilization:g} leaves of the "
                         f"{request.needed / 2**30:.2f} GiB max_num_seqs sequences would take")
    return fitted


def cuda_device_bytes() -> int:
    """Total memory of this process's first visible CUDA device, from nvidia-smi (no CUDA context, no torch
    import in a process that is about to exec vLLM); torch's when nvidia-smi is missing."""
    import subprocess

    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i",
                              visible], capture_output=True, text=True, timeout=30, check=True).stdout
        return int(float(out.strip().splitlines()[0])) << 20  # MiB
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        import torch

        return torch.cuda.get_device_properties(0).total_memory
