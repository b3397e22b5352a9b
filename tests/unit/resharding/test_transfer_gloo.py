"""SlicedTransfer over a real 2-rank gloo world: every rank ends with exactly its TP slices (cast to bf16)."""

import socket

import torch
import torch.multiprocessing as mp
from test_plan import SHAPE, model_tensors
from transfer_ranks import run_rank

from verl_like.shapes.layout import tp_slice
from verl_like.resharding.plan import build_sync_plan, param_specs
from verl_like.resharding.transfer import SlicedTransfer

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
            # Slices assembled here arrive in the wire dtype (bf16); a slice that is one piece of the rank's own
            # shard arrives as that shard's view (fp32) and is cast by the sink: equal once cast.
            assert torch.equal(got["slices"][spec.name].to(torch.bfloat16), expected), (tp, bucket, spec.name)
        assert got["stats"].received_bytes == got["expected_received"] > 0
        assert got["stats"].buckets == len(build_sync_plan(specs, 2, tp, SHAPE, bucket).buckets)
        # Slices reach the sink in training order, each once.
        assert [name for call in got["calls"] for name in call] == [s.name for s in specs]
    assert len(results[0][(2, 600)]["calls"]) > len(results[0][(2, 1 << 20)]["calls"]) == 1
    # TP=1 over 2 FSDP ranks: every slice is assembled from both ranks (bf16); TP=2: the column-parallel ones are
    # each rank's own rows (handed on uncast), the row-parallel and replicated ones are assembled.
    dtypes = {case: {t.dtype for t in results[0][case]["slices"].values()} for case in CASES}
    assert dtypes[(1, 1 << 20)] == {torch.bfloat16}
    assert dtypes[(2, 1 << 20)] == {torch.bfloat16, torch.float32}
    message = results[0]["timeout"]
    assert "rank 0 timed out after 2 s waiting to" in message and "rank 1" in message
    assert "bucket 1/1" in message


class ListSink:
    def __init__(self):
        self.loaded = []

    def load(self, named_slices):
        self.loaded += named_slices


def test_one_rank_hands_every_slice_on_as_a_view_of_its_shard_without_communication():
    """World size 1, TP=1 (the one-GPU hybrid engine): no process group is needed, nothing is copied or cast."""
    tensors = model_tensors(SHAPE, seed=5)
    specs = param_specs([(n, tuple(t.shape)) for n, t in tensors.items()], SHAPE, element_size=2)
    plan = build_sync_plan(specs, 1, 1, SHAPE, 1 << 20)
    sink = ListSink()
    stats = SlicedTransfer(plan, 0, torch.bfloat16, torch.device("cpu"), timeout_s=5).run(tensors, sink)
    assert [name for name, _ in sink.loaded] == [spec.name for spec in specs]
    for name, got in sink.loaded:
        assert got.data_ptr() == tensors[name].data_ptr() and torch.equal(got, tensors[name]), name
    assert stats.received_bytes == stats.sent_bytes == 0
    assert stats.loaded_bytes == plan.model_bytes


def test_a_parameter_larger_than_a_bucket_is_assembled_from_its_bands_on_one_rank():
    tensors = model_tensors(SHAPE, seed=6)
    specs = param_specs([(n, tuple(t.shape)) for n, t in tensors.items()], SHAPE, element_size=2)
    plan = build_sync_plan(specs, 1, 1, SHAPE, 64)  # 64 bytes: every 2-D parameter is cut into bands
    sink = ListSink()
    SlicedTransfer(plan, 0, torch.bfloat16, torch.device("cpu"), timeout_s=5).run(tensors, sink)
    for name, got in sink.loaded:
        banded = tensors[name].ndim == 2
        assert got.dtype == (torch.bfloat16 if banded else torch.float32), name
        assert torch.equal(got.to(torch.bfloat16), tensors[name].to(torch.bfloat16)), name
