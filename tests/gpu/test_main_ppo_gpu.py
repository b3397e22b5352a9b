"""main_ppo on GPUs as a user runs it: Hydra, Ray, FSDP2 over nccl, vLLM in bf16 asleep between rollouts.

The twin of tests/integration/trainer/test_main_ppo.py's smoke job, on one GPU and (when there are two) on two
with rollout TP=2, a few steps of the embedded default task with a GPU-shaped tiny model.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from verl_like.utils.tracking import read_metrics

REPO = Path(__file__).resolve().parents[2]
JOB_TIMEOUT_S = int(os.environ.get("VERL_LIKE_GPU_JOB_TIMEOUT_S", "420"))
# head_dim 64 for FlashAttention; bf16 rollout; the warm start and task of the embedded default.
GPU_OVERRIDES = [
    "+trainer=ci_smoke", "trainer.device=cuda", "trainer.total_training_steps=3", "trainer.test_freq=3",
    "+actor_rollout_ref.model.tiny_spec.hidden_size=256", "+actor_rollout_ref.model.tiny_spec.intermediate_size=512",
    "actor_rollout_ref.rollout.dtype=bfloat16", "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
    "actor_rollout_ref.actor.fsdp_config.param_dtype=bfloat16", "trainer.ray_init.num_cpus=null",
    "actor_rollout_ref.rollout.calculate_log_probs=true",  # off by default on CUDA; the test checks the gap
]


@pytest.mark.parametrize("gpus,tp", [(1, 1), (2, 2)], ids=["1gpu", "2gpu_tp2"])
def test_main_ppo_runs_on_gpus(gpus, tp, tmp_path, verl_like_cache):
    if torch.cuda.device_count() < gpus:
        pytest.skip(f"needs {gpus} GPUs")
    args = [*GPU_OVERRIDES, f"trainer.n_gpus_per_node={gpus}",
            f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}", f"trainer.default_local_dir={tmp_path}"]
    env = {**os.environ, "VERL_LIKE_CACHE_DIR": verl_like_cache, "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    # The job's output goes to a file as it runs (a job cut short by an outer time limit still leaves its log) and
    # the test stops it itself after JOB_TIMEOUT_S, failing with the log's tail.
    log_path = Path(os.environ.get("VERL_LIKE_GPU_LOG_DIR", tmp_path)) / f"main_ppo_{gpus}gpu_tp{tp}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "verl_like.main_ppo", *args], cwd=REPO, env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            returncode = proc.wait(timeout=JOB_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            returncode = None
    tail = log_path.read_text(errors="replace")[-8000:]
    assert returncode is not None, f"main_ppo did not finish in {JOB_TIMEOUT_S} s; its log ends:\n{tail}"
    assert returncode == 0, tail
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    last = records[-1]
    print(f"\n{gpus} GPU(s) tp={tp}: " + ", ".join(
        f"{k}={last[k]:.4g}" for k in ("timing_s/step", "timing_s/gen", "timing_s/update_actor",
                                       "timing_s/sync_weights", "rollout/logprob_diff_mean",
                                       "weight_sync/wall_s", "val/score/mean") if k in last))
    assert last["weight_sync/model_bytes"] > 0 and last["actor/grad_norm"] > 0
    # torch's allocator peaks on the worker's GPU since its previous update: a model's weights at least
    assert 0 < last["perf/max_memory_allocated_gb"] <= last["perf/max_memory_reserved_gb"], last
    assert last["rollout/logprob_diff_mean"] < 2e-2
