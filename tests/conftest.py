"""Environment shared by every test: offline hubs, loopback networking, vLLM's fast CPU start."""

import os

_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # vLLM on CPU: size the KV cache explicitly, run the engine in-process, skip torch.compile.
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "TORCHDYNAMO_DISABLE": "1",
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "OMP_NUM_THREADS": "1",
}
for _key, _value in _ENV.items():
    os.environ.setdefault(_key, _value)


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster for the whole session (4 logical CPUs on 2 cores; workers are mostly idle)."""
    ray = pytest.importorskip("ray")
    from verl_like.single_controller import init_ray, shutdown_all_groups

    init_ray(num_cpus=4, object_store_memory_mb=512)
    yield ray
    shutdown_all_groups()
    ray.shutdown()
