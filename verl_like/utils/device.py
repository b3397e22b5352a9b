"""The one place that decides device kind and torch.distributed backend (cpu/gloo or cuda/nccl)."""

from __future__ import annotations

import os

import torch

from verl_like.utils.tracking import MEMORY_METRICS


def is_cuda_available() -> bool:
    """True when CUDA is usable in this process (set VERL_LIKE_FORCE_CPU=1 to ignore GPUs)."""
    if os.environ.get("VERL_LIKE_FORCE_CPU") == "1":
        return False
    return torch.cuda.is_available()


def get_device_name() -> str:
    """'cuda' or 'cpu'."""
    return "cuda" if is_cuda_available() else "cpu"


def resolve_device(device: str) -> str:
    """A configured device ("auto", "cuda" or "cpu") as the concrete kind this process uses."""
    return get_device_name() if device == "auto" else device


def get_torch_device() -> torch.device:
    """The device this process computes on: its local CUDA device, or the CPU."""
    if is_cuda_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def visible_device_index(local_rank: int) -> int:
    """The CUDA device index (among this process's visible devices) of the node-local rank `local_rank`.

    Ray shows each GPU worker only the device it was given (CUDA_VISIBLE_DEVICES of one id), so that worker's
    device is index 0 whatever its local rank; torchrun-style launchers leave every device of the node visible
    and the local rank is the index. vLLM's external_launcher executor and FSDP both pick their device by this.
    """
    count = torch.cuda.device_count()
    if count == 1:
        return 0
    if not 0 <= local_rank < count:
        raise RuntimeError(
            f"local rank {local_rank} has no CUDA device: this process sees {count} "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); start one process per visible GPU"
        )
    return local_rank


def get_dist_backend() -> str:
    """torch.distributed backend for the device: nccl for CUDA tensors (gloo for CPU ones), gloo on CPU."""
    return "cuda:nccl,cpu:gloo" if is_cuda_available() else "gloo"


def ray_resource_name(device: str) -> str:
    """Ray's resource key for one process of `device` ('cuda' -> 'GPU', 'cpu' -> 'CPU')."""
    if device == "cuda":
        return "GPU"
    if device == "cpu":
        return "CPU"
    raise ValueError(f"device={device!r} is not supported; use 'cuda' or 'cpu'")


def node_ip_address() -> str:
    """This node's address as Ray knows it (127.0.0.1 on a loopback-local cluster), else 127.0.0.1."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:
        pass
    return "127.0.0.1"


_GIB = 1024 ** 3


def peak_memory_metrics(prefix: str = "perf") -> dict[str, float]:
    """This process's memory since the previous call, in GiB (verl's key names, `_gb` meaning 2^30 bytes).

    On CUDA `{prefix}/max_memory_allocated_gb` and `{prefix}/max_memory_reserved_gb`: the peaks of torch's caching
    allocator on this process's device (tensors, and what the allocator kept reserved), which are then reset so the
    next call reports its own interval. Memory outside that allocator (the CUDA context, NCCL buffers, another
    process such as a vLLM server) is not in them; nvidia-smi shows the device's total. On any device
    `{prefix}/cpu_memory_used_gb`: the process's resident host memory now (Linux; left out elsewhere).
    """
    allocated, reserved, host = (f"{prefix}/{name}" for name in MEMORY_METRICS)
    metrics: dict[str, float] = {}
    if is_cuda_available():
        metrics[allocated] = torch.cuda.max_memory_allocated() / _GIB
        metrics[reserved] = torch.cuda.max_memory_reserved() / _GIB
        torch.cuda.reset_peak_memory_stats()
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            resident_pages = int(statm.read().split()[1])
        metrics[host] = resident_pages * os.sysconf("SC_PAGE_SIZE") / _GIB
    except (OSError, ValueError, IndexError):
        pass
    return metrics
