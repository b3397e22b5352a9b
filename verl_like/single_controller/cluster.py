"""Joining a running Ray cluster or starting a local one."""

from __future__ import annotations

import logging
import os

import ray

logger = logging.getLogger(__name__)


def init_ray(
    address: str | None = None,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    object_store_memory_mb: int | None = 512,
    include_dashboard: bool = False,
    env_vars: dict[str, str] | None = None,
) -> None:
    """Connects to the cluster at `address` (or $RAY_ADDRESS), else starts a local one bound to loopback.

    `env_vars` reach every worker process (through the job's runtime_env). Does nothing if Ray is already
    initialised in this process.
    """
    if ray.is_initialized():
        return
    runtime_env = {"env_vars": dict(env_vars)} if env_vars else None
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        logger.info("joining the Ray cluster at %s", address)
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=True)
        return
    # Keep a local cluster on loopback: Ray otherwise advertises the machine's outward address.
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    logger.info("starting a local Ray cluster (num_cpus=%s, num_gpus=%s)", num_cpus, num_gpus)
    ray.init(
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        include_dashboard=include_dashboard,
        dashboard_host="127.0.0.1",
        object_store_memory=object_store_memory_mb << 20 if object_store_memory_mb else None,
        runtime_env=runtime_env,
        _node_ip_address="127.0.0.1",
    )
