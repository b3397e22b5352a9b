"""Moving a MegatronEngine's parameters and optimizer state between devices (offload / onload)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def move_params(chunks: list[nn.Module], device: torch.device) -> None:
    """Moves every parameter of the (DDP-wrapped) model chunks to `device`.

    The DDP gradient buffers stay where they are: they are zero between steps, and their `main_grad` views would
    have to be rebuilt after a move.
    """
    for chunk in chunks:
        for param in chunk.module.parameters():
            param.data = param.data.to(device, non_blocking=True)


def move_optimizer_state(optimizer: Any, device: torch.device) -> None:
    """Moves the tensors of a Megatron optimizer's (chained) torch optimizers to `device`, except `step`."""
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        for state in inner.optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and key != "step":  # AdamW keeps `step` where it wants it
                    state[key] = value.to(device, non_blocking=True)
