"""A critic on a pool of its own (`critic_pool`): PPO with GAE runs as a user runs it, the critic in its own group."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_main_ppo import _run

from verl_like.utils.tracking import read_metrics


@pytest.fixture(scope="module")
def cache_dir(verl_like_cache):
    return Path(verl_like_cache)


def test_ppo_with_the_critic_on_its_own_pool_trains_both(cache_dir, tmp_path):
    out = _run(["+trainer=ci_smoke", "algorithm.adv_estimator=gae", "critic_pool.nnodes=1",
                "critic_pool.n_gpus_per_node=1", "critic.ppo_micro_batch_size_per_gpu=4",
                f"trainer.default_local_dir={tmp_path}"], cache_dir)
    assert "resource pool 'critic_pool'" in out
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert record["critic/grad_norm"] > 0 and record["actor/grad_norm"] > 0
        assert "critic/vf_loss" in record and "critic/values/mean" in record
