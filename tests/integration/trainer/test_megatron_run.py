"""main_ppo with the Megatron engine, run as a user runs it: real Hydra, Ray, vLLM, megatron-core over gloo on the
2 CPU workers (TP=2: one data-parallel rank whose two TP ranks get the same rows)."""

from __future__ import annotations

import os
import signal
import time

import pytest
from test_main_ppo import _main_ppo, _run

from verl_like.utils.tracking import read_metrics

pytest.importorskip("megatron.core")

MEGATRON_TP2 = ["actor_rollout_ref.actor.strategy=megatron",
                "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"]
DETERMINISTIC = ("critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/grad_norm")


# The embedded default job, only the strategy changed and fewer steps. Its learning rate is constant (no warmup), so
# the total does not change the first steps: a 3-step run of it reproduces the first 3 steps of the 10-step one.
DEFAULT_JOB = [*MEGATRON_TP2, "trainer.test_freq=5"]


@pytest.fixture(scope="module")
def default_job(verl_like_cache, tmp_path_factory) -> dict[int, dict]:
    """Metrics by step (0: the validation before training) of the default job shortened to 10 steps, run straight
    through: the reward test checks them; the killed run must reproduce their first steps once resumed."""
    run = tmp_path_factory.mktemp("default_job")
    _run([*DEFAULT_JOB, "trainer.total_training_steps=10", f"trainer.default_local_dir={run}"], verl_like_cache)
    return {r["step"]: r for r in read_metrics(run / "metrics.jsonl")}


def test_default_job_with_megatron_tp2_raises_the_held_out_reward(default_job):
    """The held-out reward rises as with FSDP2, and vLLM's log-probs agree with the Megatron actor's after every
    sliced sync (Megatron TP=2 -> vLLM TP=1)."""
    val = {step: r["val/score/mean"] for step, r in default_job.items() if "val/score/mean" in r}
    assert sorted(val) == [0, 5, 10]
    assert val[0] <= 0.3, val
    assert val[10] >= 0.6 and val[10] >= val[0] + 0.3, val
    gaps = [r["rollout/logprob_diff_max"] for r in default_job.values() if "rollout/logprob_diff_max" in r]
    assert len(gaps) == 10 and max(gaps) < 1e-3, gaps


RESUMABLE = [*DEFAULT_JOB, "trainer.total_training_steps=3", "trainer.save_freq=1", "trainer.resume_mode=auto"]


def test_megatron_kill_then_resume_reproduces_the_uninterrupted_run(verl_like_cache, tmp_path, default_job):
    """kill -9 of the driver and its cluster after the step-2 checkpoint; the resumed run's metrics equal those of
    the uninterrupted run step for step (Megatron's per-rank model, optimizer and RNG state restored)."""
    run = tmp_path / "interrupted"
    metrics = run / "metrics.jsonl"
    proc = _main_ppo([*RESUMABLE, f"trainer.default_local_dir={run}"], verl_like_cache)
    deadline = time.monotonic() + 600
    while not (metrics.exists() and any(r["step"] == 2 for r in read_metrics(metrics))):
        assert proc.poll() is None, proc.stdout.read()[-4000:]
        assert time.monotonic() < deadline
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    _run([*RESUMABLE, f"trainer.default_local_dir={run}"], verl_like_cache)
    records = [r for r in read_metrics(metrics) if r["step"] > 0]
    assert {r["step"] for r in records} == {1, 2, 3}
    for record in records:
        for key in DETERMINISTIC:
            assert record[key] == pytest.approx(default_job[record["step"]][key], rel=1e-6, abs=1e-7), (record["step"], key)


def test_ppo_with_a_megatron_critic_runs(verl_like_cache, tmp_path):
    """GAE with the critic on Megatron TP=2 (the actor stays FSDP2): the critic trains every step."""
    _run(["+trainer=ci_smoke", "algorithm.adv_estimator=gae", "critic.strategy=megatron",
          "critic.megatron.tensor_model_parallel_size=2", "trainer.total_training_steps=3", "trainer.test_freq=-1",
          f"trainer.default_local_dir={tmp_path}"], verl_like_cache)
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    for record in records:
        assert 0 < record["critic/vf_loss"] < float("inf"), record
        assert 0 < record["critic/grad_norm"] < float("inf"), record


def test_megatron_actor_feeds_an_external_server(verl_like_cache, tmp_path, vllm_server):
    """Server mode with the Megatron actor: weights go from the TP shards to the session's vLLM server through vLLM's
    weight-transfer API (global rank 0 sends the gathered tensors) and the server's log-probs equal the actor's."""
    _run(["+trainer=ci_smoke", *MEGATRON_TP2, "actor_rollout_ref.rollout.mode=server",
          f"actor_rollout_ref.rollout.server.address=[{vllm_server}]", "trainer.total_training_steps=3",
          "trainer.test_freq=-1", f"trainer.default_local_dir={tmp_path}"], verl_like_cache)
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["rollout/logprob_diff_max"] < 1e-4 for r in records), records
    assert all(r["weight_sync/model_bytes"] > 0 for r in records)
