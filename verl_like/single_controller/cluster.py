"""Joining a running Ray cluster or starting a local one (bound to loopback), and describing its nodes.

Which cluster the driver uses, first match wins:
  1. `address` (trainer.ray_address): "auto", "host:port" or "ray://..." joins that cluster; "local" starts a new
     local one even if a cluster runs on this node.
  2. $RAY_ADDRESS. `ray job submit` sets it for the job's entrypoint, so a submitted job joins its cluster.
  3. The cluster `ray start` recorded on this node (Ray's own rule for a bare `ray.init()`), if it answers.
  4. Otherwise a new local cluster, bound to 127.0.0.1, with the trainer.ray_init.* sizes.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import socket
from pathlib import Path

import ray

logger = logging.getLogger(__name__)

# Set by Ray's job supervisor for the entrypoint of a submitted job: {"runtime_env": {...}, "metadata": {...}}.
JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
# Ray's switch for multi-node clusters; "0" keeps a local cluster on loopback (see _keep_local_cluster_on_loopback).
_LOOPBACK_FLAG = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def init_ray(
    address: str | None = None,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    object_store_memory_mb: int | None = 512,
    include_dashboard: bool = False,
    dashboard_host: str = "127.0.0.1",
    dashboard_port: int = 8265,
    env_vars: dict[str, str] | None = None,
) -> None:
    """Joins the cluster `resolve_cluster_address(address)` names, else starts a local one bound to loopback.

    num_cpus, num_gpus, object_store_memory_mb, include_dashboard, dashboard_host and dashboard_port size and
    expose only a
    local cluster. `env_vars` reach every worker process through the job's runtime_env; under `ray job submit`,
    keys the submitted runtime_env already sets are left to it (Ray refuses to merge two values for one key).
    Does nothing if Ray is already initialised in this process.
    """
    if ray.is_initialized():
        return
    target = resolve_cluster_address(address)
    if target is not None:
        job_env = job_env_vars()
        env = {key: value for key, value in (env_vars or {}).items() if key not in job_env}
        logger.info("joining the Ray cluster at %s (trainer.ray_init.* apply only to a local cluster)", target)
        ray.init(address=target, runtime_env={"env_vars": env} if env else None, log_to_driver=True)
        logger.info("Ray cluster: %s", describe_nodes())
        return
    _keep_local_cluster_on_loopback()
    logger.info(
        "starting a local Ray cluster (num_cpus=%s, num_gpus=%s, dashboard=%s)",
        num_cpus,
        num_gpus,
        dashboard_host if include_dashboard else "off",
    )
    ray.init(
        address="local",
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        include_dashboard=include_dashboard,
        dashboard_host=dashboard_host,
        dashboard_port=dashboard_port,
        object_store_memory=object_store_memory_mb << 20 if object_store_memory_mb else None,
        runtime_env={"env_vars": dict(env_vars)} if env_vars else None,
        _node_ip_address="127.0.0.1",
    )


def _keep_local_cluster_on_loopback() -> None:
    """Makes a local cluster bind its servers to 127.0.0.1 (unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1 is set).

    With that flag on (Ray's default on Linux), Ray maps 127.0.0.1 to the machine's outward address and its GCS,
    raylet and agents listen on every interface. The child processes read the flag from the environment; this
    process read it when ray was imported, so the module constant is set too.
    """
    os.environ.setdefault(_LOOPBACK_FLAG, "0")
    if os.environ[_LOOPBACK_FLAG] == "0":
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False


def resolve_cluster_address(address: str | None) -> str | None:
    """The address of the cluster to join (rules 1-3 of the module docstring), or None to start a local one."""
    source = "trainer.ray_address"
    if address is None and os.environ.get("RAY_ADDRESS"):
        address, source = os.environ["RAY_ADDRESS"], "$RAY_ADDRESS"
    if address is None:
        return recorded_cluster_address()
    if address == "local":
        return None
    if address.startswith(("http://", "https://")):
        raise ValueError(
            f"{source}={address!r} is a Ray dashboard (Jobs API) address; the driver joins a cluster through its GCS "
            "address (host:port, port 6379 by default) or 'auto'. Pass the dashboard address to "
            "`ray job submit --address`, and leave trainer.ray_address null inside the job."
        )
    return address


def recorded_cluster_address() -> str | None:
    """The GCS address `ray start` recorded on this node, if a cluster answers there; None otherwise."""
    try:
        from ray._private.services import find_bootstrap_address
    except ImportError:  # moved in a future Ray: fall back to local clusters only
        return None
    recorded = find_bootstrap_address(None)
    if not recorded:
        return None
    host, _, port = recorded.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=2.0).close()
    except (OSError, ValueError):
        logger.warning("ignoring %s, recorded by an earlier `ray start`: no Ray cluster answers there", recorded)
        return None
    return recorded


def job_env_vars() -> dict[str, str]:
    """The env_vars of the submitted job's runtime_env ({} when this process is not a Ray job's entrypoint)."""
    runtime_env = _job_runtime_env()
    return dict(runtime_env.get("env_vars") or {})


def job_scratch_path(path: str) -> Path | None:
    """Where a relative `path` lands if this is a Ray job with an uploaded working dir, which Ray deletes later.

    None when `path` is absolute or no working dir was uploaded (the path then means what it says).
    """
    if Path(path).expanduser().is_absolute() or not _job_runtime_env().get("working_dir"):
        return None
    return Path.cwd() / path


def _job_runtime_env() -> dict:
    raw = os.environ.get(JOB_CONFIG_ENV)
    return (json.loads(raw).get("runtime_env") or {}) if raw else {}


def node_order_key(ip: str, node_id: str) -> tuple:
    """Sort key giving nodes a stable order: by IP numerically (10.0.0.9 before 10.0.0.10), then node id.

    IPs survive restarts, node ids do not: the id only breaks ties between nodes that share an IP.
    """
    try:
        parsed = ipaddress.ip_address(ip)
    except ValueError:  # a hostname: after every IP, alphabetically
        return (1, 0, 0, ip, node_id)
    return (0, parsed.version, int(parsed), "", node_id)


def describe_nodes() -> str:
    """The alive nodes in rank order with their logical resources, e.g. '2 node(s): 10.0.0.1 (CPU=8, GPU=8), ...'."""
    nodes = sorted(
        (node for node in ray.nodes() if node.get("Alive")),
        key=lambda node: node_order_key(node["NodeManagerAddress"], node["NodeID"]),
    )
    parts = [f"{node['NodeManagerAddress']} ({format_resources(node.get('Resources', {}))})" for node in nodes]
    return f"{len(nodes)} node(s): " + ", ".join(parts)


def format_resources(resources: dict) -> str:
    """CPU, GPU and custom resources (not memory, object store or per-node markers), e.g. 'CPU=4, GPU=8'."""
    skip = ("memory", "object_store_memory")
    shown = [
        f"{key}={value:g}"
        for key, value in sorted(resources.items())
        if key not in skip and not key.startswith("node:") and not key.startswith("accelerator_type:")
    ]
    return ", ".join(shown) or "no CPU/GPU"
