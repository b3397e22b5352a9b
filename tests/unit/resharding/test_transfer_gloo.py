"""SlicedTransfer over a real 2-rank gloo world: every rank ends with exactly its TP slices (cast to bf16)."""

import socket

import torch
import torch.multiprocessing as mp
from test_plan import SHAPE, model_tensors
from transfer_ranks import run_rank

from verl_like.resharding.layout import tp_slice
from verl_like.resharding.plan import build_sync_plan, param_specs

CASES = [(1, 1 << 20), (2, 1 << 20), (2, 600)]


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_rank_transfer_gives_each_rank_its_slices_and_a_timeout_names_the_peer(tmp_path):
    tensors = model_tensors(SHAPE, seed=3)
    path = str(tmp_path / "rank")
    # Rank 1 skips the last sync (rank 0 times out waiting for it) and is killed once rank 0 is done.
    context = mp.spawn(run_rank, args=(free_port(), tensors, SHAPE, CASES, path), nprocs=2, join=False)
    context.processes[0].join(120)
    context.processes[1].kill()
    results = [torch.load(f"{path}.{rank}", weights_only=False) for rank in range(2)]
    specs = param_specs([(n, tuple(t.shape)) for n, t in tensors.items()], SHAPE, element_size=2)
    for rank, (tp, bucket) in [(rank, case) for rank in range(2) for case in CASES]:
        got = results[rank][(tp, bucket)]
        for spec in specs:
            box = tp_slice(spec.layout, spec.shape, SHAPE, rank % tp, tp)
            full = tensors[spec.name].to(torch.bfloat16)
            expected = full[box.row_start:box.row_stop]
            if full.ndim == 2:
                expected = expected[:, box.col_start:box.col_stop]
            assert torch.equal(got["slices"][spec.name], expected), (tp, bucket, spec.name)
        assert got["stats"].received_bytes == got["expected_received"] > 0
        assert got["stats"].buckets == len(build_sync_plan(specs, 2, tp, SHAPE, bucket).buckets)
        # Slices reach the sink in training order, each once.
        assert [name for call in got["calls"] for name in call] == [s.name for s in specs]
    assert len(results[0][(2, 600)]["calls"]) > len(results[0][(2, 1 << 20)]["calls"]) == 1
    message = results[0]["timeout"]
    assert "rank 0 timed out after 2 s waiting to" in message and "rank 1" in message
    assert "bucket 1/1" in message
