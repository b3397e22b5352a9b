"""Loads pre-sliced TP tensors into this process's vLLM model, in place, for one weight sync.

How vLLM loads weights: `model.load_weights(iterable of (HF name, tensor))` maps each HF name to its vLLM
parameter (q/k/v -> qkv_proj with shard id "q"/"k"/"v", gate/up -> gate_up_proj with 0/1) and calls that
parameter's `weight_loader(param, tensor[, shard_id])`. Given a FULL tensor, vLLM's loaders narrow it to this
rank's TP part themselves. They have no general "already sliced" switch (the v1 loaders honour an
`is_sharded_weight` flag, the v2 parameter classes and the vocab-parallel embedding do not), so for the duration
of a sync every TP-split parameter gets our own `weight_loader`, which writes the slice at the place
layout.py computes (fused offset; zero-filled vocab padding) and checks the shapes. vLLM's name mapping and
its loaders for replicated parameters stay in use.

On CPU, vLLM repacks linear weights after loading and empties the original parameters, so the whole sync runs
inside vLLM's layerwise-reload lifecycle (initialize -> load buckets -> finalize): the layers are put back in
their loadable form, incoming tensors are buffered per layer, and each layer is rebuilt and repacked as soon
as all of its tensors have arrived. Buckets may therefore split a layer; only the end of the sync must see
every layer complete. On CUDA the loaders write straight into the live parameters.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch

from verl_like.rollout import vllm_compat
from verl_like.shapes.decoder import DecoderShape, UnknownLayoutError
from verl_like.shapes.layout import ParamSpec, Placement, fused_shard_rows, local_destination

logger = logging.getLogger(__name__)

_MISSING = object()


def _sliced_weight_loader(name: str, offsets: dict[Any, int], padded_rows: int | None) -> Callable:
    """A vLLM-style weight loader that takes this rank's slice (not the full tensor)."""

    def sliced_weight_loader(param: torch.Tensor, loaded_weight: torch.Tensor, loaded_shard_id: Any = None) -> None:
        target = param.data
        if offsets:
            if loaded_shard_id not in offsets:
                raise ValueError(f"{name}: unexpected fused shard id {loaded_shard_id!r}; known {list(offsets)}")
            target = target.narrow(0, offsets[loaded_shard_id], loaded_weight.shape[0])
        if padded_rows is not None:
            rows = loaded_weight.shape[0]
            if target.shape[0] != padded_rows or tuple(target.shape[1:]) != tuple(loaded_weight.shape[1:]):
                raise ValueError(f"{name}: vLLM's vocab shard {tuple(target.shape)} does not take a slice "
                                 f"{tuple(loaded_weight.shape)} (padded to {padded_rows} rows)")
            target[:rows].copy_(loaded_weight)
            if rows < padded_rows:
                target[rows:].copy_(torch.zeros_like(target[rows:]))
            return
        if tuple(target.shape) != tuple(loaded_weight.shape):
            raise ValueError(f"{name} (shard {loaded_shard_id!r}): vLLM's rank-local part has shape "
                             f"{tuple(target.shape)}, the TP slice has {tuple(loaded_weight.shape)}")
        target.copy_(loaded_weight)

    return sliced_weight_loader


class VLLMSliceLoader:
    """Context for a sync into `llm` (an in-process `vllm.LLM` of this rank), reusable for every sync:

        with VLLMSliceLoader(llm, params, shape, tp_size) as loader:
            loader.load([(hf_name, slice), ...])   # any number of times, any grouping of parameters

    Where each TP-split parameter sits and the loader it gets are worked out on the first entry and kept; every
    entry looks the parameter up again (vLLM may have replaced it) and checks its rows before patching.
    """

    def __init__(self, llm: Any, params: tuple[ParamSpec, ...], shape: DecoderShape, tp_size: int) -> None:
        self.model = vllm_compat.model_runner_model(llm)
        self.model_config = llm.llm_engine.vllm_config.model_config
        self.layerwise = vllm_compat.on_cpu_platform()
        self.params = params
        self.shape = shape
        self.tp_size = tp_size
        self._saved: list[tuple[torch.Tensor, Any]] = []
        self._targets: list[tuple[str, str, torch.nn.Module, str, int | None, Callable]] | None = None
        self.loaded: set[str] = set()

    def _split_params(self) -> dict[str, list[ParamSpec]]:
        by_vllm_name: dict[str, list[ParamSpec]] = {}
        for spec in self.params:
            if spec.layout.placement is not Placement.REPLICATED:
                by_vllm_name.setdefault(spec.layout.vllm_name, []).append(spec)
        return by_vllm_name

    def _find_targets(self) -> list[tuple[str, str, torch.nn.Module, str, int | None, Callable]]:
        """(vLLM name, an HF name in it, module, attribute, rows expected on this rank, our loader) of every
        TP-split parameter."""
        targets = []
        for vllm_name, specs in self._split_params().items():
            module_name, _, attr = vllm_name.rpartition(".")
            try:
                module = self.model.get_submodule(module_name)
            except AttributeError:
                raise UnknownLayoutError(f"vLLM's model has no module {module_name!r} for {specs[0].name}") from None
            layout = specs[0].layout
            parts = fused_shard_rows(layout, self.shape, self.tp_size)
            destination = local_destination(layout, self.shape, self.tp_size)
            expected_rows = sum(parts.values()) if parts else destination.padded_rows
            offsets, start = {}, 0
            for shard, rows in parts.items():
                offsets[shard], start = start, start + rows
            loader = _sliced_weight_loader(vllm_name, offsets, destination.padded_rows)
            targets.append((vllm_name, specs[0].name, module, attr, expected_rows, loader))
        return targets

    def _patch(self) -> None:
        from vllm.model_executor.model_loader.reload.layerwise import make_online_process_loader

        if self._targets is None:
            self._targets = self._find_targets()
        for vllm_name, hf_name, module, attr, expected_rows, loader in self._targets:
            param = getattr(module, attr, None)
            if not isinstance(param, torch.Tensor):
                raise UnknownLayoutError(f"vLLM's model has no parameter {vllm_name!r} for {hf_name}")
            if expected_rows is not None and param.shape[0] != expected_rows:
                raise UnknownLayoutError(
                    f"vLLM's {vllm_name} holds {param.shape[0]} rows on this rank; the layout expects "
                    f"{expected_rows} (tensor_model_parallel_size={self.tp_size})"
                )
            self._saved.append((param, getattr(param, "weight_loader", _MISSING)))
            param.weight_loader = loader
            if self.layerwise:
                # Re-wrap so that vLLM's layerwise buffering calls our loader when the layer is complete.
                param.weight_loader = make_online_process_loader(module, attr)

    def _unpatch(self) -> None:
        for param, loader in reversed(self._saved):
            if loader is _MISSING:
                del param.weight_loader
            else:
                param.weight_loader = loader
        self._saved.clear()

    def __enter__(self) -> "VLLMSliceLoader":
        self.loaded = set()
        if self.layerwise:
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

            initialize_layerwise_reload(self.model)
        try:
            self._patch()
        except BaseException:
            self._finish()
            raise
        return self

    def load(self, named_slices: list[tuple[str, torch.Tensor]]) -> None:
        """Hands (HF name, this rank's TP slice) pairs to vLLM."""
        if named_slices:
            self.loaded.update(self.model.load_weights(named_slices))

    def _finish(self) -> None:
        try:
            if self.layerwise:
                from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

                finalize_layerwise_reload(self.model, self.model_config)
        finally:
            self._unpatch()

    def __exit__(self, *exc: object) -> None:
        self._finish()
