"""Environment shared by every test: offline hubs, loopback networking, vLLM's fast CPU start."""

import pytest

from verl_like.utils.device import get_device_name
from verl_like.utils.env import apply_default_env

apply_default_env(get_device_name())  # "cpu" in CI; tests/gpu runs on a CUDA machine


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster for the whole session (4 logical CPUs on 2 cores; workers are mostly idle)."""
    ray = pytest.importorskip("ray")
    from verl_like.single_controller import init_ray, shutdown_all_groups

    init_ray(address="local", num_cpus=4, object_store_memory_mb=512)  # never a `ray start` cluster left here
    yield ray
    shutdown_all_groups()
    ray.shutdown()


@pytest.fixture(scope="session", autouse=True)
def verl_like_cache(tmp_path_factory):
    """One model/data cache for the session (the warm-start model is built once), unless one is set already."""
    import os

    if "VERL_LIKE_CACHE_DIR" not in os.environ:
        os.environ["VERL_LIKE_CACHE_DIR"] = str(tmp_path_factory.mktemp("verl_like_cache"))
    return os.environ["VERL_LIKE_CACHE_DIR"]
