"""bench/sync_transfer_overhead.py runs and reports the parameter count of the model it builds."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench" / "sync_transfer_overhead.py"


def test_bench_reports_one_sync_of_every_parameter():
    out = subprocess.run([sys.executable, str(BENCH), "--layers", "3", "--repeats", "2"], capture_output=True,
                         text=True, timeout=300, check=True).stdout
    report = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[len("RESULT "):])
    # embed + 12 per layer (q/k/v weight and bias, o, gate, up, down, 2 norms) + final norm; tied lm_head skipped
    assert report["params"] == 1 + 12 * 3 + 1
    assert report["median_ms"] > 0
    assert report["us_per_param"] * report["params"] / 1e3 == pytest.approx(report["median_ms"])
