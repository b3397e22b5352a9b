"""The environment a one-process torch.distributed world needs (an engine built in the test process itself)."""

from __future__ import annotations

import os
import socket


def single_process_env() -> None:
    """Sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_* for a world of one on a free port, unless RANK is set."""
    if "RANK" in os.environ:
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
