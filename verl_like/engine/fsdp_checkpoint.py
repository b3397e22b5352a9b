"""Sharded checkpoints of an FSDP2 model and its optimizer (torch.distributed.checkpoint), plus per-rank extras.

Layout of a checkpoint directory (all ranks write into it; it must be on a filesystem every rank sees):
  DCP files: model and optimizer state, sharded (loadable at another world size);
  extra_state_rank{r}.pt: LR scheduler state, global step and rank r's RNG states (torch CPU and CUDA, Python,
  NumPy), so that training resumes exactly;
  huggingface/: the model's HF config (and generation config) and the tokenizer files of its model directory, so
  that `python -m verl_like.model_merger --local_dir DIR --target_dir OUT` needs nothing else (verl's layout).
Written under a staging name and renamed into place by rank 0 after a barrier (verl_like.utils.checkpoint).
"""

from __future__ import annotations

import copy
import logging
import shutil
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from verl_like.engine.shared import rank_rng_state, set_rank_rng_state
from verl_like.utils.checkpoint import commit_directory, prepare_staging, staging_path

logger = logging.getLogger(__name__)

HF_FILES_DIR = "huggingface"
# Files of a HF model directory that make up its tokenizer, and a vision-language model's processor (copied into a
# checkpoint's huggingface/ folder, and by the model merger).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "tokenizer.model", "added_tokens.json", "chat_template.jinja", "chat_template.json",
                   "preprocessor_config.json", "processor_config.json")


def _model_state(model: nn.Module, trainable_only: bool) -> dict[str, Any]:
    state = get_model_state_dict(model)
    if not trainable_only:
        return state
    trainable = {name for name, param in model.named_parameters() if param.requires_grad}
    return {key: value for key, value in state.items() if key in trainable}


def _extra_file(directory: Path, rank: int) -> Path:
    return directory / f"extra_state_rank{rank}.pt"


def save_fsdp_checkpoint(
    directory: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    global_step: int,
    group: dist.ProcessGroup | None,
    write_hf_files: Callable[[Path], None] | None = None,
    adapter_only: bool = False,
) -> None:
    """Writes the checkpoint to `directory` atomically; a collective over `group`. Rank 0 calls
    `write_hf_files(folder)` to fill the checkpoint's huggingface/ folder. adapter_only: the model state is the
    trainable (LoRA adapter) parameters alone; the frozen base is the model directory's."""
    final = Path(directory)
    rank = dist.get_rank(group)
    if rank == 0:
        prepare_staging(final)
    dist.barrier(group=group)
    staging = staging_path(final)
    state = {"model": _model_state(model, adapter_only), "optimizer": get_optimizer_state_dict(model, optimizer)}
    dcp.save(state, checkpoint_id=staging, process_group=group)
    extra = {
        "scheduler": scheduler.state_dict(),
        "global_step": global_step,
        "world_size": dist.get_world_size(group),
        "rng": rank_rng_state(),
    }
    torch.save(extra, _extra_file(staging, rank))
    if rank == 0 and write_hf_files is not None:
        write_hf_files(staging / HF_FILES_DIR)
    dist.barrier(group=group)
    if rank == 0:
        commit_directory(staging, final)
        logger.info("saved checkpoint of step %d to %s", global_step, final)
    dist.barrier(group=group)


def load_fsdp_checkpoint(
    directory: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    group: dist.ProcessGroup | None,
    adapter_only: bool = False,
) -> int:
    """Restores model, optimizer, scheduler and RNG from `directory`; returns the saved global step. Collective.
    adapter_only: the checkpoint holds the trainable parameters alone (save_fsdp_checkpoint's)."""
    directory = Path(directory)
    rank = dist.get_rank(group)
    if not _extra_file(directory, 0).is_file():
        raise FileNotFoundError(
            f"{directory} is not a finished engine checkpoint (no extra_state_rank0.pt); pass the directory that "
            "save_checkpoint wrote"
        )
    state = {"model": _model_state(model, adapter_only), "optimizer": get_optimizer_state_dict(model, optimizer)}
    dcp.load(state, checkpoint_id=directory, process_group=group)
    set_model_state_dict(model, state["model"], options=StateDictOptions(strict=not adapter_only))
    set_optimizer_state_dict(model, optimizer, state["optimizer"])
    own = _extra_file(directory, rank)
    extra = torch.load(own if own.is_file() else _extra_file(directory, 0), weights_only=False)
    scheduler.load_state_dict(extra["scheduler"])
    if own.is_file():
        set_rank_rng_state(extra["rng"])
    else:
        logger.warning(
            "checkpoint %s was written by %d ranks; rank %d has no RNG state there and keeps its current one",
            directory, extra["world_size"], rank,
        )
    logger.info("loaded checkpoint of step %d from %s", extra["global_step"], directory)
    return int(extra["global_step"])


def hf_files_writer(hf_config: Any, architecture: str, model_dir: str | Path) -> Callable[[Path], None]:
    """A `write_hf_files` for save_fsdp_checkpoint: `hf_config` (its architecture the trained model's class, e.g.
    Qwen2ForTokenClassification for a critic) plus the tokenizer files found in `model_dir`."""

    def write(folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        config = copy.deepcopy(hf_config)
        config.use_cache = True  # the engine trains without a KV cache; the merged model generates
        config.architectures = [architecture]
        config.save_pretrained(folder)
        source = Path(model_dir)
        for name in (*TOKENIZER_FILES, "generation_config.json"):
            if (source / name).is_file():
                shutil.copy2(source / name, folder / name)

    return write
