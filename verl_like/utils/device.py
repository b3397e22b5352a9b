"""The one place that decides device kind and torch.distributed backend (cpu/gloo or cuda/nccl)."""

from __future__ import annotations

import os

import torch


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
