"""bench/startup_profile.py: its importtime parsing, and one cheap run end to end (fresh interpreters, real imports)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "bench" / "startup_profile.py"


def _load_bench():
    spec = importlib.util.spec_from_file_location("startup_profile", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_importtime_top_orders_modules_by_cumulative_time():
    stderr = "\n".join([
        "import time: self [us] | cumulative | imported package",
        "import time:       100 |        100 |   small",
        "import time:      2000 |    3500000 | big",
        "import time:       900 |      12000 |     medium.child",
        "some other line a module printed",
    ])
    top = _load_bench().importtime_top(stderr, 2)
    assert top == [(3.5, " big"), (0.012, "     medium.child")]


def test_bench_times_each_probe_in_a_fresh_interpreter_and_refuses_unknown_ones():
    done = subprocess.run([sys.executable, str(BENCH), "--probes", "python,ray", "--repeats", "2"],
                          capture_output=True, text=True, timeout=300, check=True)
    report = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
    for probe in ("python", "ray"):
        assert len(report[probe]["seconds"]) == 2
        # the statement's time lies inside its process's wall time
        assert all(0 <= s <= w for s, w in zip(report[probe]["seconds"], report[probe]["process_s"]))
    assert max(report["ray"]["seconds"]) > max(report["python"]["seconds"])  # importing ray is not free
    bad = subprocess.run([sys.executable, str(BENCH), "--probes", "python,nonsense"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode != 0 and "nonsense" in bad.stderr

