"""bench/step_throughput.py --smoke: the GPU step benchmark's whole path (trainer, Ray, vLLM, FSDP) on 2 CPU workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_step_bench_smoke_reports_every_phase(tmp_path, verl_like_cache):
    env = {**os.environ, "VERL_LIKE_CACHE_DIR": verl_like_cache, "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "bench/step_throughput.py", "--smoke", "--workdir", str(tmp_path),
                           "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    report = json.loads(out.read_text())
    # One optimizer step per batch: the update's own forward gives the old log-probs (recompute_old_log_prob auto).
    assert set(report["seconds"]) == {"rollout", "update", "weight_sync"}
    assert report["recompute_old_log_prob"] is False and report["old_log_prob_forward"] is False
    throughput = report["tokens_per_s_per_gpu"]
    assert throughput.pop("log_probs") is None and all(v > 0 for v in throughput.values())
    assert 0 < sum(report["share"].values()) <= 1.0
    assert report["weight_sync_gb"] > 0 and report["launch_to_first_rollout_s"] > 0
    assert report["logprob_diff_mean"] < 1e-3  # fp32 rollout vs fp32 actor on the same tokens
    # the trainer's own memory beside nvidia-smi's device peak: on CPU its workers' resident host memory only
    assert list(report["trainer_memory_gib"]) == ["cpu_memory_used_gb"]
    assert 0.1 < report["trainer_memory_gib"]["cpu_memory_used_gb"] < 24
    # No budget or fused-kernel flag: the defaults, which on CPU keep the configured (fallback) budgets unsized and
    # the Triton kernels off (#30 goal 2).
    assert report["max_tokens_per_gpu"] is None and report["use_fused_kernels"] is False
    assert report["token_budgets"] == {"actor/token_budget": 16384.0, "actor/log_prob_token_budget": 16384.0}
