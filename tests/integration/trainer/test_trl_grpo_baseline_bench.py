"""bench/trl_grpo_baseline.py --smoke: TRL's GRPOTrainer on the step bench's workload, tiny and on CPU.

TRL is not a dependency of verl_like: this skips unless `trl` is importable (e.g. PYTHONPATH=/tmp/trl_extra after
`pip install --no-deps --target /tmp/trl_extra .whl/trl/*.whl`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def test_trl_bench_smoke_reports_full_length_steps_and_trl_timers(tmp_path):
    pytest.importorskip("trl")
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "bench/trl_grpo_baseline.py", "--smoke", "--workdir", str(tmp_path),
                           "--out", str(out)], cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    report = json.loads(out.read_text())
    assert len(report["per_step_s"]) == report["steps"] == 2 and report["step_s"] > 0
    assert report["completion_length_min"] == report["completion_length_max"] == report["response_len"]
    assert report["gradient_accumulation_steps"] * report["per_device_batch"] == report["prompts"] * report["n"]
    assert report["trl_timers_s"]["transformers.generate"] > 0
    assert report["versions"]["trl"] and report["use_liger_kernel"] is False
