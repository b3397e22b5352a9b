"""A MegatronEngine's weights in HF names and layout: who holds which box, this rank's boxes, full tensors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from verl_like.engine.base import WeightHoldings
from verl_like.engine.hf_export import write_hf_directory
from verl_like.engine.megatron.convert import assemble, hf_boxes, megatron_to_hf


def gpt_model(chunk: torch.nn.Module) -> torch.nn.Module:
    """The GPTModel inside a DDP-wrapped chunk (under a Float16Module when computing in bf16)."""
    module = chunk.module
    return module.module if type(module).__name__ == "Float16Module" else module


class MegatronWeights:
    """The HF view of an engine's Megatron chunks; `hf_params` is (name, shape) in the HF model's order."""

    def __init__(self, engine: Any, hf_params: list[tuple[str, tuple[int, ...]]]) -> None:
        self.engine = engine
        ps = engine._ps
        self.tp_group = ps.get_tensor_model_parallel_group()
        self.pp_group = ps.get_pipeline_model_parallel_group()
        # Every rank's (tp_rank, pp_rank), so that the holdings are a pure function (one collective, here).
        coords = [None] * dist.get_world_size()
        dist.all_gather_object(coords, (engine.tp_rank, engine.pp_rank))
        self.coords: list[tuple[int, int]] = [tuple(c) for c in coords]
        shape, tp, pp, vpp = engine.shape, engine.tp, engine.pp, engine.vpp
        self.boxes = {(t, p): hf_boxes(shape, t, tp, p, pp, vpp) for t in range(tp) for p in range(pp)}
        self.params = [(name, size) for name, size in hf_params if any(name in self.boxes[(0, p)] for p in range(pp))]
        self.owner_stage = {name: next(p for p in range(pp) if name in self.boxes[(0, p)]) for name, _ in self.params}

    def holdings(self) -> WeightHoldings:
        boxes = tuple(
            tuple(self.boxes[coord].get(name) for coord in self.coords) for name, _ in self.params
        )
        return WeightHoldings(tuple(self.params), boxes)

    def local_shards(self) -> dict[str, torch.Tensor]:
        engine = self.engine
        pieces: dict[str, torch.Tensor] = {}
        for vp_stage, chunk in enumerate(engine.chunks):
            state = {name: param.detach() for name, param in gpt_model(chunk).named_parameters()}
            pieces.update(megatron_to_hf(engine.shape, state, engine.tp_rank, engine.tp, engine.pp_rank, engine.pp,
                                         engine.vpp, vp_stage))
        return {name: pieces[name] for name, _ in self.params if name in pieces}

    def _gather_tp(self, name: str, full_shape: tuple[int, ...], piece: torch.Tensor) -> torch.Tensor:
        """The full tensor from this stage's TP pieces (a collective over the TP group)."""
        engine = self.engine
        if engine.tp == 1:
            return piece
        boxes = [self.boxes[(t, engine.pp_rank)][name] for t in range(engine.tp)]
        rows = max(box.rows for box in boxes)
        padded = piece.new_zeros((rows, *piece.shape[1:]))
        padded[: piece.shape[0]] = piece
        gathered = [torch.empty_like(padded) for _ in range(engine.tp)]
        dist.all_gather(gathered, padded.contiguous(), group=self.tp_group)
        return assemble(full_shape, [(box, g[: box.rows]) for box, g in zip(boxes, gathered)])

    def full_state(self) -> Iterator[tuple[str, torch.Tensor]]:
        engine = self.engine
        local = self.local_shards()
        stage_ranks = dist.get_process_group_ranks(self.pp_group)
        for name, full_shape in self.params:
            owner = self.owner_stage[name]
            if engine.pp_rank == owner:
                full = self._gather_tp(name, full_shape, local[name].to(engine.device))
            else:
                full = torch.empty(full_shape, dtype=torch.float32, device=engine.device)
            if engine.pp > 1:
                dist.broadcast(full, src=stage_ranks[owner], group=self.pp_group)
            yield name, full.detach().cpu()

    def export_hf(self, directory: str | Path, tokenizer: Any | None = None) -> None:
        """Gathers the full HF state (a collective) and writes it from global rank 0, like FSDPEngine.export_hf."""
        engine = self.engine
        state_dict = dict(self.full_state())
        if dist.get_rank() == 0:
            write_hf_directory(directory, engine.hf_class, engine.hf_config, state_dict, tokenizer,
                               strict=not engine.shape.tie_word_embeddings)
        dist.barrier()
