"""Environment variables every verl_like process needs (driver and Ray workers), in one place."""

from __future__ import annotations

import os

# Offline hubs (models are local directories) and quiet telemetry, on every device.
_COMMON = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    # vLLM runs inside the worker process (the hybrid engine), not in a subprocess of its own.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    # vLLM's per-step INFO lines stay out of the log (trainer.log_level; verl_like/utils/quiet_logs.py).
    "VLLM_LOGGING_LEVEL": "WARNING",
    "VERL_LIKE_LOG_LEVEL": "WARNING",
}

# vLLM's CPU build: size the KV cache explicitly (it otherwise takes 92% of RAM), skip torch.compile, keep
# sockets on loopback, and one OpenMP thread per worker so two workers share two cores without thrashing.
_CPU = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "TORCHDYNAMO_DISABLE": "1",
    # With dynamo off, a user's plain `LLM(model)` (no enforce_eager) must not try vLLM's AOT compile either.
    "VLLM_USE_AOT_COMPILE": "0",
    "VLLM_HOST_IP": "127.0.0.1",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "OMP_NUM_THREADS": "1",
}

# NVLink multicast can take a shared host's GPUs out of service (the lent H200 machines forbid it); the small
# gain is not worth that risk anywhere.
_CUDA = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def default_env(device: str) -> dict[str, str]:
    """The defaults for `device` ("cpu" or "cuda"); a value already set in os.environ wins."""
    env = {**_COMMON, **(_CPU if device == "cpu" else _CUDA)}
    return {key: os.environ.get(key, value) for key, value in env.items()}


def apply_default_env(device: str) -> dict[str, str]:
    """Sets the defaults for `device` in this process (keeping values already set) and returns them."""
    env = default_env(device)
    os.environ.update(env)
    return env
