"""Writing a full state dict as a HF model directory (what every engine's `export_hf` ends with)."""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import torch

from verl_like.utils.checkpoint import commit_directory, prepare_staging

logger = logging.getLogger(__name__)


def write_hf_directory(
    directory: str | Path,
    hf_class: type,
    hf_config: Any,
    state_dict: dict[str, torch.Tensor],
    tokenizer: Any | None = None,
    strict: bool = True,
) -> None:
    """Builds `hf_class(hf_config)` around `state_dict` and saves it (and the tokenizer) to `directory` atomically.

    `strict=False` lets a tied model's state dict leave out lm_head.weight (tie_weights restores it).
    """
    staging = prepare_staging(directory)
    hf_config = copy.deepcopy(hf_config)
    hf_config.use_cache = True  # the engines run without a KV cache; the exported model generates
    with torch.device("meta"):
        plain = hf_class(hf_config)
    plain.load_state_dict(state_dict, assign=True, strict=strict)
    plain.tie_weights()
    plain.save_pretrained(staging)
    if tokenizer is not None:
        tokenizer.save_pretrained(staging)
    commit_directory(staging, directory)
    logger.info("exported %s to %s", hf_class.__name__, directory)
