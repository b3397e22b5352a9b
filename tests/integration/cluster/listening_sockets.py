"""Starts a local cluster through init_ray (argv: dashboard host or "default") and prints, as JSON, every
listening TCP socket of this process and its descendants: [[process name, is the dashboard, ip, port], ...]."""

import json
import sys

import psutil

from verl_like.single_controller import init_ray

if __name__ == "__main__":
    host = sys.argv[1]
    init_ray(num_cpus=1, include_dashboard=True, object_store_memory_mb=128,
             **({} if host == "default" else {"dashboard_host": host}))
    me = psutil.Process()
    sockets = []
    for proc in [me, *me.children(recursive=True)]:
        try:
            is_dashboard = any(arg.endswith("dashboard/dashboard.py") for arg in proc.cmdline())
            listening = [c for c in proc.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
        except psutil.Error:
            continue
        sockets += [[proc.name(), is_dashboard, c.laddr.ip, c.laddr.port] for c in listening]
    print("SOCKETS " + json.dumps(sockets))
