"""A gloo process group beside torch.distributed's default one, for links between separately started processes."""

from __future__ import annotations

import datetime
import socket
from typing import Any

import torch
from torch.distributed import PrefixStore, TCPStore


def gloo_group(address: str, port: int, rank: int, world_size: int, timeout_s: float, prefix: str) -> Any:
    """A gloo process group of `world_size` ranks meeting at the TCP store `address:port`, hosted by rank 0.

    Built without the default process group, which a vLLM worker and an FSDP trainer already own. Every wait
    (the rendezvous included) raises after `timeout_s`.
    """
    timeout = datetime.timedelta(seconds=timeout_s)
    store = TCPStore(address, port, world_size, is_master=rank == 0, timeout=timeout, wait_for_workers=False)
    options = torch.distributed.ProcessGroupGloo._Options()
    options._timeout = timeout
    options._devices = [torch.distributed.ProcessGroupGloo.create_device(hostname=address)]
    return torch.distributed.ProcessGroupGloo(PrefixStore(prefix, store), rank, world_size, options)


def free_port(address: str = "127.0.0.1") -> int:
    """A TCP port free on `address` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])
