"""Environment shared by every test: offline hubs, loopback networking, vLLM's fast CPU start."""

import pytest

from verl_like.utils.env import apply_default_env

apply_default_env("cpu")


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster for the whole session (4 logical CPUs on 2 cores; workers are mostly idle)."""
    ray = pytest.importorskip("ray")
    from verl_like.single_controller import init_ray, shutdown_all_groups

    init_ray(num_cpus=4, object_store_memory_mb=512)
    yield ray
    shutdown_all_groups()
    ray.shutdown()
