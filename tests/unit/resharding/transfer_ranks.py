"""Bodies of the 2-rank gloo transfer test (run under torch.multiprocessing spawn)."""

import os
import time

import torch
import torch.distributed as dist

from verl_like.resharding.plan import build_sync_plan, fsdp_rows, param_specs
from verl_like.resharding.transfer import SlicedTransfer, WeightSyncTimeoutError


class CollectingSink:
    def __init__(self):
        self.slices, self.calls = {}, []

    def load(self, named_slices):
        self.calls.append([name for name, _ in named_slices])
        self.slices.update({name: tensor.clone() for name, tensor in named_slices})


def run_rank(rank, port, tensors, shape, cases, result_path):
    """For each (tp, bucket_bytes) in cases: moves the shards of `tensors`; then the timeout case."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    specs = param_specs([(n, tuple(t.shape)) for n, t in tensors.items()], shape, element_size=2)
    shards = {n: t[slice(*fsdp_rows(t.shape[0], 2, rank))].clone() for n, t in tensors.items()}
    results = {}
    for tp, bucket_bytes in cases:
        plan = build_sync_plan(specs, 2, tp, shape, bucket_bytes)
        sink = CollectingSink()
        stats = SlicedTransfer(plan, rank, torch.bfloat16, torch.device("cpu"), timeout_s=60).run(shards, sink)
        results[(tp, bucket_bytes)] = dict(slices=sink.slices, calls=sink.calls, stats=stats,
                                           expected_received=plan.received_bytes(rank))
    torch.save(results, f"{result_path}.{rank}")
    dist.barrier()
    if rank == 1:  # skips the next sync; the test kills it once rank 0 is done
        time.sleep(120)
    plan = build_sync_plan(specs, 2, 1, shape, 1 << 20)
    try:
        SlicedTransfer(plan, 0, torch.bfloat16, torch.device("cpu"), timeout_s=2).run(shards, CollectingSink())
        results["timeout"] = "no error"
    except WeightSyncTimeoutError as err:
        results["timeout"] = str(err)
    torch.save(results, f"{result_path}.{rank}")
    os._exit(0)  # skip destroy_process_group: this group saw a timed-out receive
