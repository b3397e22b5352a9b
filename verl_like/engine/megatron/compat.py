"""The megatron-core API differences between the versions we support (0.16.1 on CPU CI, 0.19.x on the GPUs).

Everything here was read in and run against 0.16.1. For 0.19.2 the names used below were checked in the notes
(/work/shared/MEGATRON-NOTES.md: GPTModel, the local spec, DDP, get_megatron_optimizer and the schedules ran
there); lines marked "0.19: unchecked" could not be verified on this machine (it cannot install 0.19).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

MIN_VERSION = (0, 16)


def megatron_version() -> tuple[int, ...]:
    """megatron-core's version as integers (major, minor, patch)."""
    from megatron.core import package_info

    return tuple(int(part) for part in package_info.__version__.split(".")[:3] if part.isdigit())


def check_version() -> None:
    """Raises when the installed megatron-core is older than we support."""
    version = megatron_version()
    if version[:2] < MIN_VERSION:
        raise ImportError(
            f"megatron-core {'.'.join(map(str, version))} is too old for the Megatron engine; install >= 0.16.1"
        )


def local_layer_spec() -> Any:
    """The decoder layer spec made of megatron-core's own modules (no TransformerEngine), with RMSNorm."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    return get_gpt_layer_local_spec(normalization="RMSNorm")


def optimizer_config(**fields: Any) -> Any:
    """megatron's OptimizerConfig with the given fields; fields this version lacks raise naming them."""
    from megatron.core.optimizer import OptimizerConfig

    known = set(inspect.signature(OptimizerConfig).parameters)
    unknown = sorted(set(fields) - known)
    if unknown:
        raise TypeError(f"this megatron-core's OptimizerConfig has no fields {unknown}")
    return OptimizerConfig(**fields)


def build_optimizer(config: Any, model_chunks: list[torch.nn.Module], use_gloo_groups: bool) -> Any:
    """get_megatron_optimizer over the model chunks (0.16.1 and 0.19: same keyword names; 0.19: unchecked
    beyond the notes' run)."""
    from megatron.core.optimizer import get_megatron_optimizer

    return get_megatron_optimizer(config, model_chunks, use_gloo_process_groups=use_gloo_groups)


def finalize_grads(model_chunks: list[torch.nn.Module]) -> None:
    """Megatron's gradient finalisation (DP all-reduce, tied-embedding and sequence-parallel all-reduces) without
    its per-token scaling (num_tokens=None): our loss contract already normalises."""
    from megatron.core.distributed import finalize_model_grads

    finalize_model_grads(model_chunks, num_tokens=None)


def forward_backward_func() -> Any:
    """The schedule for the current parallel state (no pipelining, 1F1B, or interleaved 1F1B)."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    return get_forward_backward_func()
