"""What both training engines (FSDP2 and Megatron) need and neither owns: joining the process group, a rank's
RNG state for checkpoints, and the guards that name the engine in their errors."""

from __future__ import annotations

import os
import random
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from verl_like.utils.device import get_dist_backend, is_cuda_available, visible_device_index

T = TypeVar("T")


def init_process_group_from_env() -> None:
    """Joins the default process group from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT unless already joined."""
    if dist.is_initialized():
        return
    missing = [key for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if key not in os.environ]
    if missing:
        raise RuntimeError(
            f"torch.distributed is not initialised and the environment lacks {missing}; start the engine under a "
            "WorkerGroup or torchrun, or call torch.distributed.init_process_group first"
        )
    if is_cuda_available():
        torch.cuda.set_device(visible_device_index(int(os.environ.get("LOCAL_RANK", 0))))
    dist.init_process_group(backend=get_dist_backend())


def single_process_env() -> None:
    """Sets RANK, WORLD_SIZE, LOCAL_RANK and MASTER_ADDR/PORT for a world of one on a free loopback port (a bench
    or test that builds an engine in its own process, without torchrun), unless RANK is set already."""
    if "RANK" in os.environ:
        return
    from verl_like.utils.gloo import free_port

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))


def rank_rng_state() -> dict[str, Any]:
    """This rank's RNG states (torch CPU and CUDA, Python, NumPy), saved with a checkpoint to resume exactly."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if is_cuda_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rank_rng_state(state: dict[str, Any]) -> None:
    """Restores what `rank_rng_state` returned (the CUDA states only where CUDA is there)."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and is_cuda_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def require_onloaded(params_offloaded: bool, engine: str, op: str) -> None:
    """Raises when `engine.op` runs while the parameters sit on the CPU."""
    if params_offloaded:
        raise RuntimeError(f"{engine}.{op}: parameters are offloaded to CPU; call onload() first")


def require_optimizer(optimizer: T | None, engine: str, op: str) -> T:
    """The engine's optimizer; raises for an engine built for inference only."""
    if optimizer is None:
        raise RuntimeError(
            f"{engine}.{op}: this engine was built with inference_only=True (no optimizer); build it with "
            "inference_only=False to train"
        )
    return optimizer
