"""run_ppo_update normalises the loss with the counts the engine hands each micro-batch, with no collective of its
own (the engine already counted the mini-batch over its data-parallel group)."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from verl_like.algorithms import LossNormalizer, aggregate_loss
from verl_like.engine.base import LOSS_COUNTS_KEY, ForwardBackwardResult
from verl_like.protocol import DataProto
from verl_like.workers.ppo_update import metric_entries, rows_that_train, run_ppo_update

ROWS, LENGTH = 4, 3


@pytest.fixture(scope="module")
def one_rank_group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


class FakeEngine:
    """A one-rank engine that reports mini-batch counts as if a second rank held as many tokens and rows again."""

    dp_size = 1
    current_lr = 1e-3

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.dp_group = group
        self.global_step = 0
        self.losses: list[float] = []

    def forward_backward(self, batch, loss_fn, temperature=1.0, calculate_entropy=False) -> ForwardBackwardResult:
        mask = batch.batch["response_mask"]
        counts = {"global_token_count": 2 * int(mask.sum()), "global_sequence_count": 2 * len(batch)}
        metrics: dict[str, list[float]] = {}
        for rows in ([0, 1], [2, 3]):
            micro_batch = batch[rows]
            micro_batch.meta_info.update(counts)
            loss, entries = loss_fn({"log_probs": torch.ones(len(rows), LENGTH)}, micro_batch)
            self.losses.append(float(loss))
            for name, value in entries.items():
                metrics.setdefault(name, []).append(float(value))
        return ForwardBackwardResult(loss=sum(self.losses), metrics=metrics, num_micro_batches=2)

    def optimizer_step(self, lr_scale: float = 1.0) -> float:
        self.global_step += 1
        return 0.0


def make_loss_fn(normalizer: LossNormalizer):
    def loss_fn(outputs, micro_batch):
        mask = micro_batch.batch["response_mask"]
        loss = aggregate_loss(outputs["log_probs"], mask, normalizer)
        return loss, metric_entries({"pg_loss": loss}, {}, mask)

    return loss_fn


def test_the_loss_reads_the_engines_counts_and_runs_no_collective_of_its_own(one_rank_group, monkeypatch):
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]])
    batch = DataProto.from_dict(tensors={"response_mask": mask, "responses": torch.zeros(ROWS, LENGTH)})
    settings = SimpleNamespace(PREFIX="actor", ppo_epochs=1, shuffle=False, data_loader_seed=0,
                               loss_agg_mode="token-mean", mini_batch_size_per_rank=lambda dp_size, n: ROWS)
    engine = FakeEngine(one_rank_group)
    calls = []
    all_reduce = dist.all_reduce
    monkeypatch.setattr(dist, "all_reduce", lambda *args, **kwargs: (calls.append(1), all_reduce(*args, **kwargs))[1])
    history = run_ppo_update(engine, batch, settings, make_loss_fn, rollout_n=1)
    # This rank's tokens are half the engine's global count: its shares sum to 1/2, not 1.
    assert sum(engine.losses) == pytest.approx(0.5)
    assert history["pg_loss"] == [pytest.approx(0.5)]
    assert len(calls) == 1  # the metrics' reduction only; the normaliser's counts came from the engine


def test_engine_counts_give_the_normaliser_of_the_whole_mini_batch():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 1, 1]])
    meta = {"global_token_count": 5, "global_sequence_count": 2}
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
        assert LossNormalizer.from_engine_counts(meta, mode) == LossNormalizer.for_mini_batch(
            mask, mode, dp_group=None, grad_reduction="sum")
    assert LossNormalizer.from_engine_counts(meta, "seq-mean-token-sum-norm", loss_scale_factor=3.0) == (
        LossNormalizer.for_mini_batch(mask, "seq-mean-token-sum-norm", dp_group=None, grad_reduction="sum"))
    with pytest.raises(KeyError, match="global_sequence_count"):
        LossNormalizer.from_engine_counts({"global_token_count": 5}, "token-mean")


def test_rows_that_train_keep_the_marked_rows_and_the_whole_mini_batchs_counts(one_rank_group):
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]])
    meta = {"temperature": 0.7}
    batch = DataProto.from_dict(tensors={"response_mask": mask, "responses": torch.zeros(ROWS, LENGTH),
                                         "row": torch.arange(ROWS)}, meta_info=meta)
    rows, skipped = rows_that_train(batch, torch.tensor([False, True, True, False]), one_rank_group)
    assert rows.batch["row"].tolist() == [1, 2] and skipped == 0.5
    assert rows.meta_info == {"temperature": 0.7, LOSS_COUNTS_KEY: (6, 3)}  # 6 tokens, 3 rows with one
    assert meta == {"temperature": 0.7}  # the mini-batch's own meta_info is untouched
    none, skipped = rows_that_train(batch, torch.zeros(ROWS, dtype=torch.bool), one_rank_group)
    assert none.batch["row"].tolist() == [0] and skipped == 0.75  # one row runs: its gradient is zero
    three, skipped = rows_that_train(batch, torch.tensor([True, True, False, True]), one_rank_group, row_multiple=2)
    assert three.batch["row"].tolist() == [0, 1, 2, 3] and skipped == 0.0  # 3 rounded up to a multiple of 2
    one, _ = rows_that_train(batch, torch.tensor([False, False, True, False]), one_rank_group, row_multiple=2)
    assert one.batch["row"].tolist() == [0, 2]
    with pytest.raises(ValueError, match=r"a bool per row \(4,\)"):
        rows_that_train(batch, torch.tensor([1, 0, 1, 0]), one_rank_group)
