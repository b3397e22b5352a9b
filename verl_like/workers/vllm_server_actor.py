"""`VLLMServerActor`: a Ray actor on the rollout pool that starts one vLLM server and supervises it.

The server (`python -m verl_like.serve`, which execs vLLM's: the command `VLLMServerBackend.launch_command` builds,
rollout/vllm_server.py) is a child process tied to the actor: it dies with the
actor even on kill -9 (the kernel's parent-death signal), its engine processes end with it (they watch it), and
`stop()` ends its whole process group. Its output goes to a log
file whose tail the driver shows when the server fails.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import tempfile
from pathlib import Path

from verl_like.rollout.server_backend import ServerBackend
from verl_like.rollout.vllm_server import VLLM_SERVER
from verl_like.utils.gloo import free_port

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In the child before exec: SIGKILL when the parent (the Ray actor) dies, whatever kills it."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class VLLMServerActor:
    """One vLLM server: `start()` launches it and returns its address; the driver then polls its /health.

    index: the server's number (in errors and log names). host: bind address (loopback unless the pool spans
    nodes, then this node's address). extra_args: vLLM flags appended to verl_like.serve's. backend: the
    ServerBackend whose launch_command starts the server (default vLLM's).
    """

    def __init__(self, index: int, model_path: str, tensor_parallel_size: int, device: str, host: str,
                 extra_args: list[str], log_dir: str | None = None, backend: ServerBackend | None = None) -> None:
        self.backend = backend or VLLM_SERVER
        self.index = index
        self.model_path = model_path
        self.tensor_parallel_size = tensor_parallel_size
        self.device = device
        self.host = host
        self.extra_args = list(extra_args)
        self.log_path = Path(log_dir or tempfile.gettempdir()) / f"verl_like_server_{index}_{os.getpid()}.log"
        self.process: subprocess.Popen | None = None
        self.port: int | None = None

    def start(self) -> str:
        """Launches the server process; returns its address (http://host:port). A restart keeps the port, so the
        trainer's clients and weight transport reach the new server at the old address."""
        port = self.port if self.port is not None else free_port(self.host)
        self.port = port
        command = self.backend.launch_command(self.model_path, port=port, host=self.host,
                                              tensor_parallel_size=self.tensor_parallel_size, device=self.device,
                                              extra_args=self.extra_args)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent,
        )
        log.close()
        logger.info("server %d: pid %d on %s:%d, log %s", self.index, self.process.pid, self.host, port, self.log_path)
        return f"http://{self.host}:{port}"

    def restart(self) -> str:
        """Ends the server (if it still runs) and launches it again on the same port; returns its address."""
        self.stop()
        with open(self.log_path, "ab") as log:
            log.write(b"\n--- verl_like: restarting the server ---\n")
        return self.start()

    def node_ip(self) -> str:
        """This node's address (where a server bound to 0.0.0.0 is reached)."""
        from verl_like.utils.device import node_ip_address

        return node_ip_address()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the server's output (what to show when it failed)."""
        try:
            return self.log_path.read_bytes()[-chars:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout_s: float = 20.0) -> None:
        """Ends the server's process group: SIGTERM, then SIGKILL after `timeout_s`."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=timeout_s)
        except ProcessLookupError:
            pass

    def __del__(self) -> None:
        # `ray.remote(VLLMServerActor)` builds a class object whose collection runs this too, without __init__.
        if getattr(self, "process", None) is not None:
            self.stop(timeout_s=5.0)
