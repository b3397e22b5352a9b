"""A real two-node Ray cluster on loopback, started with `ray start` the way docs/cluster.md describes.

Head on 127.0.0.3, worker node on 127.0.0.4, 2 CPUs each, dashboard (Jobs API) on 127.0.0.1. Ray remaps
127.0.0.1 to the machine's outward address when a worker node joins, so the nodes use other loopback addresses.
Everything lives in its own temp dir and process sessions: stopping it kills only those processes, never other
Ray clusters on the machine (`ray stop` would kill them all), and nothing is written to os.environ.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[3]
HEAD_IP, WORKER_IP = "127.0.0.3", "127.0.0.4"
CPUS_PER_NODE = 2
RAY_CLI = str(Path(sys.executable).with_name("ray"))
# Variables of the caller that must not reach the cluster: an address would point the job elsewhere, and the
# multi-node switch (set to 0 by the test session's defaults) makes `ray start --address` refuse to join.
_DROPPED_ENV = ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_TMPDIR", "RAY_AUTH_TOKEN_PATH")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LoopbackCluster:
    temp_dir: Path
    gcs_address: str
    dashboard_url: str
    env: dict[str, str]
    sessions: list[int] = field(default_factory=list)

    def submit(self, entrypoint: list[str], env_vars: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess:
        """`ray job submit --working-dir .` from the repository root; waits for the job to end (or the timeout)."""
        command = [
            RAY_CLI, "job", "submit", "--address", self.dashboard_url, "--working-dir", ".",
            "--runtime-env-json", json.dumps({"env_vars": env_vars}), "--", *entrypoint,
        ]
        return subprocess.run(
            command, cwd=REPO, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            timeout=timeout_s,
        )

    def processes(self) -> list[psutil.Process]:
        """Every process of the cluster's sessions, with all their descendants (job drivers start new sessions)."""
        found: dict[int, psutil.Process] = {}
        for proc in psutil.process_iter():
            try:
                if os.getsid(proc.pid) in self.sessions:
                    found[proc.pid] = proc
                    for child in proc.children(recursive=True):
                        found[child.pid] = child
            except (psutil.Error, OSError):
                continue
        found.pop(os.getpid(), None)
        return list(found.values())

    def stop(self, grace_s: float = 5.0) -> list[psutil.Process]:
        """SIGTERM to every process of the cluster, SIGKILL to those alive after grace_s; returns survivors."""
        procs = self.processes()
        for proc in procs:
            _signal(proc, signal.SIGTERM)
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
        for proc in alive:
            _signal(proc, signal.SIGKILL)
        _, survivors = psutil.wait_procs(alive, timeout=5.0)
        return survivors


def _signal(proc: psutil.Process, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except psutil.Error:
        pass


def start_cluster() -> LoopbackCluster:
    """Starts the head, then the worker node; raises with ray's output if either fails."""
    # Unix socket paths under the temp dir must stay short (~107 bytes): /tmp, not pytest's deep tmp_path.
    temp_dir = Path(tempfile.mkdtemp(prefix="vlc", dir="/tmp"))
    env = {key: value for key, value in os.environ.items() if key not in _DROPPED_ENV}
    env.update(
        # The job's `python` is the one the cluster was started with: this interpreter, with verl_like's deps.
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        # Token auth (Ray's default) without touching ~/.ray: the nodes and the job CLI share this token.
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=secrets.token_hex(32),
        RAY_USAGE_STATS_ENABLED="0",
        # Fixed default ports of the metrics servers would clash with another cluster on this machine.
        DASHBOARD_METRIC_PORT=str(free_port()),
        AUTOSCALER_METRIC_PORT=str(free_port()),
    )
    gcs_port, dashboard_port = free_port(), free_port()
    cluster = LoopbackCluster(
        temp_dir=temp_dir,
        gcs_address=f"{HEAD_IP}:{gcs_port}",
        dashboard_url=f"http://127.0.0.1:{dashboard_port}",
        env=env,
    )
    common = ["--num-cpus", str(CPUS_PER_NODE), "--object-store-memory", str(256 << 20), "--disable-usage-stats",
              "--dashboard-agent-listen-port", str(free_port())]
    _ray_start(cluster, [
        "--head", "--port", str(gcs_port), "--node-ip-address", HEAD_IP, "--temp-dir", str(temp_dir),
        "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard_port),
        "--ray-client-server-port", str(free_port()), *common,
    ])
    worker_dir = temp_dir / "worker"
    worker_dir.mkdir()
    _ray_start(cluster, [
        "--address", cluster.gcs_address, "--node-ip-address", WORKER_IP, "--temp-dir", str(worker_dir), *common,
    ])
    return cluster


def _ray_start(cluster: LoopbackCluster, args: list[str]) -> None:
    # Output to a file, not a pipe: the daemons ray start leaves behind could hold a pipe open.
    log = cluster.temp_dir / f"ray_start_{len(cluster.sessions)}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [RAY_CLI, "start", *args], env=cluster.env, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
    # The daemons stay in the session ray start opened: that is how stop() finds them.
    cluster.sessions.append(proc.pid)
    try:
        returncode = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        returncode = "timeout (120 s)"
    if returncode != 0:
        raise RuntimeError(f"ray start {' '.join(args)} failed: {returncode}\n{log.read_text()[-4000:]}")
