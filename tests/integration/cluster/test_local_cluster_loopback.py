"""A local cluster started by init_ray listens only on loopback: GCS, raylet, agents, metrics and dashboard."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import verl_like.single_controller.cluster as cluster

SCRIPT = Path(__file__).with_name("listening_sockets.py")


def _is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def test_local_cluster_with_dashboard_listens_only_on_loopback():
    # A driver that imported ray before any loopback setting, as main_ppo does (RAY_TMPDIR: keep its files apart).
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")}
    with tempfile.TemporaryDirectory(prefix="vlc", dir="/tmp") as temp_dir:
        env["RAY_TMPDIR"] = temp_dir
        result = subprocess.run(
            [sys.executable, str(SCRIPT), "default"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, timeout=180,
        )
    assert result.returncode == 0, result.stdout[-6000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("SOCKETS "))
    sockets = json.loads(line.removeprefix("SOCKETS "))
    assert any(is_dashboard for _, is_dashboard, _, _ in sockets), sockets
    assert len(sockets) >= 5, sockets  # gcs, raylet, dashboard, agents: the check below covers real servers
    exposed = [s for s in sockets if not _is_loopback(s[2])]
    assert not exposed, f"listening beyond loopback: {exposed}"
    assert all(ip == "127.0.0.1" for _, is_dashboard, ip, _ in sockets if is_dashboard), sockets


def test_configured_dashboard_host_reaches_ray_init(monkeypatch):
    calls = []
    monkeypatch.setattr(cluster.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(cluster.ray, "init", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setattr(cluster, "resolve_cluster_address", lambda address: None)
    cluster.init_ray(num_cpus=2, include_dashboard=True, dashboard_host="10.1.2.3", dashboard_port=8300)
    assert calls[0]["dashboard_host"] == "10.1.2.3" and calls[0]["include_dashboard"] is True
    assert calls[0]["dashboard_port"] == 8300
    assert calls[0]["address"] == "local" and calls[0]["_node_ip_address"] == "127.0.0.1"
