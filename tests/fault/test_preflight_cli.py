"""Fault suite, start-up: settings this machine cannot honour stop `main_ppo` within seconds, before Ray starts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_main_ppo_refuses_cuda_without_a_gpu_before_ray(tmp_path):
    """The other preflight cases go through the same call; tests/unit/trainer/test_preflight.py has them."""
    named = "trainer.device=cuda but this machine has no usable GPU"
    args = ["+trainer=ci_smoke", f"trainer.default_local_dir={tmp_path / 'run'}", "trainer.device=cuda"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "VERL_LIKE_FORCE_CPU": "1"}
    env.pop("RAY_ADDRESS", None)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "verl_like.main_ppo", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "preflight error" in out and named in out, out[-3000:]
    assert "starting a local Ray cluster" not in out and "joining the Ray cluster" not in out
    assert time.monotonic() - start < 60
