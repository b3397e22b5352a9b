"""Per-rank checkpoints of a MegatronEngine: model chunks, optimizer, step and RNG states, written atomically.

Layout of a checkpoint directory (on a filesystem every rank sees): rank{r}.pt per global rank r, holding that
rank's Megatron parameters (per model chunk), its optimizer state, the global step, its RNG states (torch, CUDA,
Python, NumPy and Megatron's tracker) and the parallel layout. Resuming needs the same layout; another layout is
refused naming both (reshard through `export_hf` and a fresh engine instead). Written under a staging name and
renamed into place by rank 0 after a barrier (verl_like.utils.checkpoint).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from verl_like.engine.megatron.weights import gpt_model
from verl_like.engine.shared import rank_rng_state, set_rank_rng_state
from verl_like.utils.checkpoint import commit_directory, prepare_staging, staging_path

logger = logging.getLogger(__name__)


def _layout(engine: Any) -> dict[str, int | None]:
    return {"tensor_model_parallel_size": engine.tp, "pipeline_model_parallel_size": engine.pp,
            "virtual_pipeline_model_parallel_size": engine.vpp, "data_parallel_size": engine.dp_size}


def _tracker_states() -> dict[str, torch.Tensor]:
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    return {name: state.clone() for name, state in get_cuda_rng_tracker().get_states().items()}


def _check_plain_optimizer(engine: Any, op: str) -> None:
    if engine._distributed_optimizer:
        raise ValueError(
            f"MegatronEngine.{op}: the distributed optimizer's sharded state is not checkpointed; set "
            "megatron.use_distributed_optimizer=false (the default) to checkpoint"
        )


def save_megatron_checkpoint(engine: Any, directory: str | Path) -> None:
    """Writes every rank's state to `directory` atomically (a collective over the whole world)."""
    _check_plain_optimizer(engine, "save_checkpoint")
    directory = Path(directory)
    staging = staging_path(directory)
    if dist.get_rank() == 0:
        prepare_staging(directory)
    dist.barrier()
    state = {
        "layout": _layout(engine),
        "model": [{name: p.detach().cpu().clone() for name, p in gpt_model(chunk).named_parameters()}
                  for chunk in engine.chunks],
        "optimizer": engine.optimizer.state_dict(),
        "global_step": engine.global_step,
        "rng": rank_rng_state(),
        "megatron_rng": _tracker_states(),
    }
    torch.save(state, staging / f"rank{dist.get_rank()}.pt")
    dist.barrier()
    if dist.get_rank() == 0:
        commit_directory(staging, directory)
        logger.info("saved a Megatron checkpoint (step %d) to %s", engine.global_step, directory)
    dist.barrier()


def load_megatron_checkpoint(engine: Any, directory: str | Path) -> int:
    """Restores what `save_megatron_checkpoint` wrote for this rank; returns the global step."""
    _check_plain_optimizer(engine, "load_checkpoint")
    path = Path(directory) / f"rank{dist.get_rank()}.pt"
    if not path.is_file():
        raise FileNotFoundError(f"no Megatron checkpoint for rank {dist.get_rank()} at {path}")
    state = torch.load(path, map_location="cpu", weights_only=False)
    if state["layout"] != _layout(engine):
        raise ValueError(
            f"the checkpoint at {directory} was written with the Megatron layout {state['layout']}, this engine "
            f"runs {_layout(engine)}; resume with the same megatron.* sizes (or export_hf and start from it)"
        )
    with torch.no_grad():
        for chunk, saved in zip(engine.chunks, state["model"]):
            for name, param in gpt_model(chunk).named_parameters():
                param.copy_(saved[name])
    engine.optimizer.load_state_dict(state["optimizer"])
    set_rank_rng_state(state["rng"])
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    get_cuda_rng_tracker().set_states(state["megatron_rng"])
    return int(state["global_step"])
