"""Environment shared by every test: offline hubs, loopback networking, vLLM's fast CPU start."""

import contextlib

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


@pytest.fixture(scope="session")
def warmstart_model(verl_like_cache):
    """The embedded default job's policy (the warm-started tiny model), built once per session."""
    from verl_like.config.loader import load_config
    from verl_like.trainer.setup import resolve_model_path

    return resolve_model_path(load_config([]))


@pytest.fixture(scope="session")
def vllm_server(warmstart_model, tmp_path_factory):
    """One vLLM server for the session, started as a user starts one (`python -m verl_like.serve`) on the
    default policy: fp32, loopback, our gloo weight-transfer engine, fault hooks on. Tests that send it weights
    own it while they run (each connects and syncs its own policy first). Yields its address."""
    # VERL_LIKE_FAULT_HOOKS: tests/integration/rollout/test_server_faults.py arms its HTTP 500 hook.
    with running_server(warmstart_model, tmp_path_factory.mktemp("vllm_server"), ["--max-num-seqs", "128"],
                        {"VERL_LIKE_FAULT_HOOKS": "1"}) as address:
        yield address


# rollout/server_lora.py: rank 8 (the LoRA tests' adapters), a window of 2 (staleness 0) plus 1 for the tests that
# keep an older version loaded.
LORA_SERVER_ARGS = ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "3", "--max-cpu-loras", "3"]


@pytest.fixture(scope="session")
def vllm_lora_server(warmstart_model, tmp_path_factory):
    """A second session server like `vllm_server`, started with LoRA (`LORA_SERVER_ARGS`): adapter-only sync
    (tests/integration/rollout/test_server_lora.py, the server-mode LoRA run). Yields its address."""
    with running_server(warmstart_model, tmp_path_factory.mktemp("vllm_lora_server"),
                        ["--max-num-seqs", "128", *LORA_SERVER_ARGS], {"VERL_LIKE_FAULT_HOOKS": "1"}) as address:
        yield address


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory):
    """The tiny Idefics3 (models/tiny_vlm.py), built once per session."""
    from verl_like.models.tiny_vlm import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("tiny_vlm") / "tiny_vlm")


@pytest.fixture(scope="session")
def vlm_server(tiny_vlm_dir, tmp_path_factory):
    """A vLLM server (`python -m verl_like.serve`) on the tiny VLM for the session, fp32. Yields its address."""
    with running_server(str(tiny_vlm_dir), tmp_path_factory.mktemp("vlm_server"),
                        ["--max-num-seqs", "32", "--limit-mm-per-prompt", '{"image": 2}']) as address:
        yield address


@contextlib.contextmanager
def running_server(model_path: str, log_dir, extra_args: list[str], env: dict[str, str] | None = None):
    """A `python -m verl_like.serve` process on `model_path` (fp32, max-model-len 128, seed 0) until the block
    ends; yields its address. It dies with this test process even when that is killed."""
    import os
    import signal
    import subprocess
    import sys

    from verl_like.utils.gloo import free_port
    from verl_like.rollout.server_client import ServerClient
    from verl_like.workers.vllm_server_actor import die_with_parent

    port = free_port()
    log_path = log_dir / "server.log"
    log = open(log_path, "wb")
    command = [sys.executable, "-m", "verl_like.serve", model_path, "--port", str(port),
               "--dtype", "float32", "--max-model-len", "128", "--seed", "0", *extra_args]
    # Its engine processes follow the server.
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                               preexec_fn=die_with_parent, env={**os.environ, **(env or {})})
    address = f"http://127.0.0.1:{port}"
    client = ServerClient(address, "session server")
    try:
        client.wait_healthy(600, alive=lambda: process.poll() is None)
    except Exception as err:
        os.killpg(process.pid, signal.SIGKILL)
        raise RuntimeError(f"{err}\n{log_path.read_text()[-3000:]}") from err
    try:
        yield address
    finally:
        client.close()
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        log.close()
