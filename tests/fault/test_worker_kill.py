"""Fault suite, processes: kill -9 of one worker process (FSDP actor and the vLLM engine inside it) of a running
`main_ppo`: the run ends within 60 s with an error naming the rank, and nothing of it is left running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from verl_like.utils.tracking import read_metrics

REPO = Path(__file__).resolve().parents[2]


def session_processes(sid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every process of session `sid`: the driver, its local Ray cluster, and the Ray
    workers (each in a process group of its own, but in the driver's session)."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid=,sid=,args="], capture_output=True, text=True).stdout
    rows = [line.split(None, 2) for line in out.splitlines()]
    return [(int(pid), args) for pid, session, args in (r for r in rows if len(r) == 3) if int(session) == sid]


def test_killed_worker_ends_the_run_naming_the_rank_and_leaves_nothing(tmp_path, verl_like_cache):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "VERL_LIKE_CACHE_DIR": str(verl_like_cache)}
    env.pop("RAY_ADDRESS", None)
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "verl_like.main_ppo", "+trainer=ci_smoke", "trainer.total_training_steps=50",
         "trainer.test_freq=-1", f"trainer.default_local_dir={run}"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 600
        while not ((run / "metrics.jsonl").exists() and read_metrics(run / "metrics.jsonl")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-4000:]
            time.sleep(0.2)
        workers = [pid for pid, args in session_processes(proc.pid) if "WorkerHost" in args]
        assert len(workers) == 2, session_processes(proc.pid)
        os.kill(workers[-1], signal.SIGKILL)  # mid-step: the loop runs step after step
        killed = time.monotonic()
        out, _ = proc.communicate(timeout=120)
    finally:
        for pid, _ in session_processes(proc.pid) if proc.poll() is None else ():
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode not in (0, None)
    assert time.monotonic() - killed < 60, out[-4000:]
    assert "WorkerDiedError" in out and "rank" in out, out[-4000:]
    deadline = time.monotonic() + 30
    while session_processes(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not session_processes(proc.pid)  # no Ray actor, vLLM engine or Ray server outlives the run
