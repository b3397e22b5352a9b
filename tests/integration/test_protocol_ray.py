"""DataProto through a real local Ray cluster: object store round trips, actor calls, refs handed between actors."""

from __future__ import annotations

import numpy as np
import pytest
import ray
import torch

from verl_like.protocol import DataProto, pad_to_divisor, unpad
from verl_like.protocol_ops import values_equal


@pytest.fixture(scope="module")
def scorers(ray_cluster):  # the session's local Ray cluster (tests/conftest.py)
    """Two worker actors shared by the tests (each start imports torch: seconds on 2 cores)."""
    actors = [Scorer.remote(rank) for rank in range(2)]
    yield actors
    for actor in actors:
        ray.kill(actor)


@ray.remote(num_cpus=0.5)
class Scorer:
    """Stands in for a worker: changes its input in place, adds columns and metrics, returns it."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def score(self, data: DataProto) -> DataProto:
        data.batch["log_probs"].mul_(2)  # in place: the received tensors must be writable
        data.non_tensor_batch["reward"][:] += 1.0  # a numeric column, also written in place
        data.batch["scores"] = data.batch["input_ids"].sum(dim=1).to(torch.float32)
        data.non_tensor_batch["scored_by"] = np.array([f"rank{self.rank}"] * len(data), dtype=object)
        data.meta_info["metrics"] = {"score/mean": float(data.batch["scores"].mean()), "rows": len(data)}
        data.check_consistency()
        return data

    def describe(self, data: DataProto) -> dict:
        return {
            "rows": len(data),
            "dtypes": {key: str(t.dtype) for key, t in data.batch.items()},
            "scored_by": list(data.non_tensor_batch.get("scored_by", [])),
        }


def make_batch(rows: int) -> DataProto:
    ids = torch.arange(rows * 4, dtype=torch.int64).reshape(rows, 4)
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "log_probs": ids.to(torch.float32) / 8,
            "ref_log_probs": ids.to(torch.bfloat16),
            "response_mask": ids % 3 != 0,
        },
        non_tensors={
            "raw_prompt": [f"prompt {i}" for i in range(rows)],
            "ground_truth": [{"answer": i} for i in range(rows)],
            "reward": np.zeros(rows, dtype=np.float64),
        },
        meta_info={"temperature": 0.8, "step": 3},
    )


def assert_same(a: DataProto, b: DataProto) -> None:
    assert len(a) == len(b) and list(a.batch.keys()) == list(b.batch.keys())
    for key in a.batch.keys():
        assert a.batch[key].dtype == b.batch[key].dtype and torch.equal(a.batch[key], b.batch[key]), key
    assert values_equal(a.non_tensor_batch, b.non_tensor_batch) and values_equal(a.meta_info, b.meta_info)


def test_put_get_round_trip(ray_cluster):
    data = make_batch(6)
    restored = ray.get(ray.put(data))
    assert_same(restored, data)
    restored.batch["input_ids"].add_(1)  # writable and not the driver's memory
    restored.non_tensor_batch["reward"][0] = 5.0
    assert data.batch["input_ids"][0, 0] == 0 and data.non_tensor_batch["reward"][0] == 0.0
    for empty in (DataProto(meta_info={"metrics": {"a": 1.0}}), make_batch(0)):
        assert_same(ray.get(ray.put(empty)), empty)


def test_actor_modifies_and_returns(scorers):
    data = make_batch(4)
    result = ray.get(scorers[0].score.remote(data))
    assert torch.equal(result.batch["log_probs"], data.batch["log_probs"] * 2)
    assert torch.equal(result.batch["scores"], data.batch["input_ids"].sum(dim=1).float())
    assert result.non_tensor_batch["reward"].tolist() == [1.0] * 4
    assert list(result.non_tensor_batch["scored_by"]) == ["rank0"] * 4
    assert result.non_tensor_batch["ground_truth"][3] == {"answer": 3}
    assert result.meta_info["step"] == 3 and result.meta_info["metrics"]["rows"] == 4
    assert "scores" not in data.batch.keys() and data.non_tensor_batch["reward"].tolist() == [0.0] * 4


def test_refs_pass_between_actors_without_the_driver(scorers):
    first, second = scorers
    data_ref = ray.put(make_batch(3))
    scored_ref = first.score.remote(data_ref)  # Ray resolves the ref into a DataProto inside the actor
    description = ray.get(second.describe.remote(scored_ref))
    assert description["rows"] == 3 and description["scored_by"] == ["rank0"] * 3
    assert description["dtypes"]["ref_log_probs"] == "torch.bfloat16"


def test_pad_dispatch_collect_unpad_over_two_actors(scorers):
    data = make_batch(5)
    workers = scorers
    padded, pad_size = pad_to_divisor(data, len(workers))
    futures = [worker.score.remote(chunk) for worker, chunk in zip(workers, padded.chunk(len(workers)))]
    collected = unpad(DataProto.concat(ray.get(futures)), pad_size)
    assert len(collected) == 5 and pad_size == 1
    assert torch.equal(collected.batch["scores"], data.batch["input_ids"].sum(dim=1).float())
    assert list(collected.non_tensor_batch["scored_by"]) == ["rank0"] * 3 + ["rank1"] * 2
    assert collected.meta_info["metrics"]["rows"] == [3, 3]
    assert collected.meta_info["temperature"] == 0.8
