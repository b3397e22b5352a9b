"""Megatron's process groups (parallel_state) over the whole default group: set up once per process, shared by
every MegatronEngine in it (actor and reference), torn down by tests that change layouts."""

from __future__ import annotations

import torch.distributed as dist

from verl_like.config.megatron import MegatronConfig


def _current_sizes() -> tuple[int, int, int | None]:
    from megatron.core import parallel_state as ps

    return (ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size(),
            ps.get_virtual_pipeline_model_parallel_world_size())


def ensure_model_parallel(parallel: MegatronConfig, prefix: str = "megatron") -> None:
    """Initialises parallel_state for `parallel` over the whole world, or checks that the existing one matches."""
    from megatron.core import parallel_state as ps

    parallel.check(prefix)
    parallel.dp_size(dist.get_world_size(), prefix)
    wanted = (parallel.tensor_model_parallel_size, parallel.pipeline_model_parallel_size,
              parallel.virtual_pipeline_model_parallel_size)
    if ps.model_parallel_is_initialized():
        if _current_sizes() != wanted:
            raise ValueError(
                f"{prefix}: this process already runs Megatron with (tensor, pipeline, virtual pipeline) sizes "
                f"{_current_sizes()}, and another engine asks for {wanted}; every Megatron role colocated in one "
                "process needs the same tensor_model_parallel_size, pipeline_model_parallel_size and "
                "virtual_pipeline_model_parallel_size"
            )
        return
    ps.initialize_model_parallel(
        tensor_model_parallel_size=wanted[0],
        pipeline_model_parallel_size=wanted[1],
        virtual_pipeline_model_parallel_size=wanted[2],
    )


def reset_model_parallel() -> None:
    """Forgets parallel_state's groups (so that another layout can be set up in the same process)."""
    from megatron.core import parallel_state as ps

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
