"""What each rank of the 2-process gloo group runs for the Qwen2-VL engine tests (results back by file)."""

from __future__ import annotations

import os
import socket
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine_reference import policy_loss
from qwen_vl_rows import TEMPERATURE

ROWS_RANK0 = 3


def _local(batch: dict, rank: int):
    from verl_like.protocol import DataProto

    rows = slice(0, ROWS_RANK0) if rank == 0 else slice(ROWS_RANK0, None)
    return DataProto.from_dict(tensors={key: value[rows] for key, value in batch.items()})


def _run(rank: int, model_dir: str, batch: dict) -> dict:
    from verl_like.engine.config import EngineConfig
    from verl_like.engine.fsdp import FSDPEngine

    engine = FSDPEngine(EngineConfig(model_path=model_dir, micro_batch_size_per_rank=2, lr=1e-3, eps=1e-5))
    local = _local(batch, rank)
    results = {"log_probs": engine.forward(local, temperature=TEMPERATURE).batch["log_probs"]}
    step = engine.forward_backward(local, policy_loss, temperature=TEMPERATURE)
    results.update(loss=step.loss, num_micro_batches=step.num_micro_batches, grad_norm=engine.optimizer_step())
    bad = dict(batch)
    if rank == 1:  # one rank's row 0 loses an image-grid row: its placeholders no longer match its features
        bad["image_grid_thw"] = batch["image_grid_thw"].clone()
        bad["image_grid_thw"][ROWS_RANK0, 1] = 0
    try:
        engine.forward(_local(bad, rank))
        results["mismatch"] = "no error"
    except Exception as exc:  # noqa: BLE001 - the test reads the message
        results["mismatch"] = f"{type(exc).__name__}: {exc}"
    return results


def _worker(rank: int, world_size: int, port: int, model_dir: str, batch: dict, out_dir: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo")
    try:
        results = _run(rank, model_dir, batch)
    except Exception:  # noqa: BLE001 - reported to the test
        results = {"error": traceback.format_exc()}
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


def run_two_ranks(model_dir: str, batch: dict, workdir: str) -> list[dict]:
    """Each rank's results of `_run` on 2 gloo ranks (rank 0 holds rows 0-2, rank 1 the rest)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_worker, args=(2, port, model_dir, batch, workdir), nprocs=2, join=True)
    return [torch.load(Path(workdir) / f"rank{rank}.pt", weights_only=False) for rank in range(2)]
