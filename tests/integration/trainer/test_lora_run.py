"""main_ppo with a LoRA actor (`actor_rollout_ref.model.lora_rank=8`), run as a user runs it (real Hydra, Ray, PEFT
on FSDP2, vLLM with the adapter in-process or a vLLM server).

- Colocated: the default job raises the held-out reward from <= 0.3 to >= 0.7; every sync after the first moves the
  adapter's bytes alone, and the sync check passes every step. Killed with kill -9 after its first checkpoint and
  resumed, it reproduces the uninterrupted run's metrics exactly.
- Server mode, adapter-only (the session's LoRA server, `vllm_lora_server`): the same job raises the reward the
  same way; every sync after the first moves the adapter's bytes alone and the sync check scores the server under
  the adapter every step. Merged weights (`lora.merge=true`, the session's plain server): a short run whose syncs
  move the whole merged model and pass the sync check.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from test_main_ppo import DETERMINISTIC, _main_ppo, _run, _wait_for_step
from test_server_mode_run import server_job

from verl_like.utils.tracking import read_metrics

pytest.importorskip("vllm")
pytest.importorskip("peft")

# LoRA learns at ~10x a full fine-tune's rate, decayed (docs/lora.md: constant 1e-2 plateaus near 0.7, 1.2e-2
# diverges); alpha/r = 4.
LORA = ["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=32",
        "actor_rollout_ref.actor.optim.lr=1e-2", "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine"]
STEPS = 10
RESUMABLE = [*LORA, f"trainer.total_training_steps={STEPS}", f"trainer.test_freq={STEPS // 2}",
             f"trainer.save_freq={STEPS // 2}", "trainer.resume_mode=auto"]
ADAPTER_BYTES = 131072  # rank 8 on every Linear of the tiny model's 2 layers, fp32
MODEL_BYTES = 1239552  # the tiny model's 309,888 parameters, fp32 (a merged sync)


@pytest.fixture(scope="module")
def cache_dir(verl_like_cache):
    return Path(verl_like_cache)


@pytest.fixture(scope="module")
def straight(cache_dir, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("lora_straight")
    _run([*RESUMABLE, f"trainer.default_local_dir={run}"], cache_dir)
    return run


def assert_reward_rises(records: list[dict]) -> None:
    val = {r["step"]: r["val/score/mean"] for r in records if "val/score/mean" in r}
    assert sorted(val) == [0, STEPS // 2, STEPS]
    assert val[0] <= 0.3 and val[STEPS] >= 0.7, val


def test_lora_default_job_raises_the_held_out_reward_moving_only_adapter_bytes(straight):
    records = read_metrics(straight / "metrics.jsonl")
    assert_reward_rises(records)
    trained = [r for r in records if r["step"] > 0]
    assert all(r["sync/bytes"] == r["sync/adapter_bytes"] == ADAPTER_BYTES for r in trained)
    assert all(r["sync/base_bytes"] == 0 for r in trained)
    assert all(r["rollout/sync_check_gap"] < 1e-4 for r in trained)


def test_lora_run_killed_then_resumed_reproduces_the_uninterrupted_run(cache_dir, tmp_path, straight):
    """Also with the sync check off (`rollout.sync_check=false`): no probe metric, and the same training."""
    run = tmp_path / "interrupted"
    metrics = run / "metrics.jsonl"
    args = [*RESUMABLE, "actor_rollout_ref.rollout.sync_check=false", f"trainer.default_local_dir={run}"]
    proc = _main_ppo(args, cache_dir)
    _wait_for_step(proc, metrics, STEPS // 2 + 1)
    os.killpg(proc.pid, signal.SIGKILL)  # driver and its local Ray cluster, after the checkpoint of step STEPS/2
    proc.wait()
    _run(args, cache_dir)
    assert not any("rollout/sync_check_gap" in r for r in read_metrics(metrics))
    expected = {r["step"]: r for r in read_metrics(straight / "metrics.jsonl")}
    for record in read_metrics(metrics):
        if record["step"] == 0:
            continue
        for key in DETERMINISTIC:
            assert record[key] == pytest.approx(expected[record["step"]][key], rel=1e-6, abs=1e-7), (record["step"], key)
    checkpoint = next((run / "checkpoints").glob(f"global_step_{STEPS // 2}")) / "actor"
    assert (checkpoint / "lora_adapter" / "adapter_config.json").is_file()


def test_lora_server_mode_adapter_only_raises_the_held_out_reward_moving_only_adapter_bytes(
        cache_dir, tmp_path, vllm_lora_server):
    _run([*server_job(vllm_lora_server), *LORA, f"trainer.total_training_steps={STEPS}",
          f"trainer.default_local_dir={tmp_path}"], cache_dir)
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert_reward_rises(records)
    trained = [r for r in records if r["step"] > 0]
    assert all(r["sync/bytes"] == r["sync/adapter_bytes"] == ADAPTER_BYTES for r in trained)  # every rank's
    assert all(r["sync/base_bytes"] == 0 for r in trained)
    assert all(r["rollout/sync_check_gap"] < 1e-4 for r in trained)  # the server scored the probe every step


def test_lora_server_mode_merged_syncs_the_merged_model(cache_dir, tmp_path, vllm_server):
    _run([*server_job(vllm_server), *LORA, "actor_rollout_ref.model.lora.merge=true",
          "trainer.total_training_steps=2", f"trainer.default_local_dir={tmp_path}"], cache_dir)
    trained = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["step"] > 0]
    assert len(trained) == 2
    assert all("sync/adapter_bytes" not in r and r["sync/bytes"] == MODEL_BYTES for r in trained)  # every rank's
    assert all(r["rollout/sync_check_gap"] < 1e-4 for r in trained)
