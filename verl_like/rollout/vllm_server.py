"""`VLLMServerBackend`: the vLLM server's protocol behind `ServerBackend` (rollout/server_backend.py).

Launch: `python -m verl_like.serve` (which execs vLLM's OpenAI server with our flags, extension and middleware) and
the vLLM flags of the rollout node. Generation: our lean route `POST /verl_like/generate` (rollout/server_generate.py)
or, on a plain `vllm serve`, `/v1/completions` with token ids in and out. Pause/resume and the weight update: vLLM's
native dev-mode endpoints (`/pause`, `/resume`, `/init_weight_transfer_engine`, `/start_weight_update`,
`/update_weights`, `/finish_weight_update`) with our gloo engine's or vLLM's ipc engine's info (the latter's shape
per vLLM release from vllm_compat). Imports no vLLM.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from verl_like.rollout.kv_cache import KV_BYTES_FLAG, KV_FIT_FLAG, KV_WEIGHTS_FLAG, KVCacheRequest
from verl_like.rollout.server_backend import Completion, ServerBackend, ServerRequest
from verl_like.rollout.server_generate import ROUTE as GENERATE_ROUTE
from verl_like.rollout.server_generate import decode_array

# vLLM's refusal of start_weight_update while an earlier update is open (the worker's message, every release we
# support).
ABANDONED_UPDATE = "weight update is already active"


def _spans(spans: Any) -> list[tuple[str, int, int]] | None:
    return [(str(v), int(start), int(end)) for v, start, end in spans] if spans else None


def lean_completions(answer: Mapping[str, Any]) -> list[Completion]:
    """The samples of a lean route's answer (`{"samples": [...]}`, server_generate.encode_output)."""
    return [
        Completion(decode_array(sample["token_ids"], "<i4").tolist(),
                   decode_array(sample["log_probs"], "<f4").tolist(), sample["finish_reason"],
                   _spans(sample.get("weight_versions")))
        for sample in answer["samples"]
    ]


def openai_completions(answer: Mapping[str, Any]) -> list[Completion]:
    """The samples of a `/v1/completions` answer asked for token ids and sampled log-probs."""
    out = []
    for choice in sorted(answer["choices"], key=lambda choice: choice["index"]):
        tokens = [int(token) for token in choice["token_ids"]]
        log_probs = [float(lp) for lp in choice["logprobs"]["token_logprobs"]]
        if len(log_probs) != len(tokens):
            raise ValueError(f"{len(log_probs)} log-probs for {len(tokens)} tokens in a completion")
        out.append(Completion(tokens, log_probs, choice.get("finish_reason")))
    return out


class VLLMServerBackend(ServerBackend):
    """vLLM's OpenAI server as `python -m verl_like.serve` starts it (module doc)."""

    label = "vLLM"

    # ----- launch -----

    def launch_command(self, model_path: str, *, port: int, host: str, tensor_parallel_size: int, device: str,
                       extra_args: Sequence[str] = ()) -> list[str]:
        return [sys.executable, "-m", "verl_like.serve", model_path, "--port", str(port), "--host", host,
                "--tensor-parallel-size", str(tensor_parallel_size), "--device", device, *extra_args]

    def engine_args(self, rollout: Any, *, hf_overrides: Mapping[str, Any] | None = None,
                    trust_remote_code: bool = False, weight_transfer: str = "gloo", adapter_rank: int = 0,
                    adapter_window: int = 0, kv_cache: KVCacheRequest | None = None) -> list[str]:
        args = [
            "--dtype", rollout.dtype,
            "--max-model-len", str(rollout.engine_max_model_len),
            "--gpu-memory-utilization", str(rollout.gpu_memory_utilization),
            "--max-num-seqs", str(rollout.max_num_seqs),
            *(["--max-num-batched-tokens", str(rollout.max_num_batched_tokens)]
              if rollout.max_num_batched_tokens is not None else []),
            "--seed", str(rollout.seed),
            "--load-format", rollout.load_format,
            "--enable-prefix-caching" if rollout.enable_prefix_caching else "--no-enable-prefix-caching",
        ]
        if kv_cache is not None and kv_cache.fit:  # verl_like.serve fits it on the server's device
            args += [KV_FIT_FLAG, str(kv_cache.needed), KV_WEIGHTS_FLAG, str(kv_cache.weight_bytes)]
        elif kv_cache is not None:
            args += [KV_BYTES_FLAG, str(kv_cache.needed)]
        if rollout.enforce_eager:
            args.append("--enforce-eager")
        if hf_overrides:
            args += ["--hf-overrides", json.dumps(dict(hf_overrides))]
        if trust_remote_code:
            args.append("--trust-remote-code")
        if weight_transfer != "gloo":
            args += ["--weight-transfer", weight_transfer]
        args += list(rollout.server.extra_args)
        if adapter_rank:
            from verl_like.rollout.server_lora import server_lora_args

            args += server_lora_args(adapter_rank, adapter_window)
        return args

    # ----- generation -----

    def generate_request(self, prompt_ids: Sequence[int], params: Mapping[str, Any], *, lean: bool,
                         model: str | None = None, adapter: str | None = None) -> ServerRequest:
        params = dict(params)
        log_probs = params.pop(self.LOG_PROBS_FIELD, "decode")
        if lean:
            body: dict[str, Any] = {"prompt_token_ids": list(prompt_ids), "params": params}
            if log_probs != "decode":
                body["log_probs"] = log_probs
            if adapter is not None:
                body["lora_name"] = adapter
            return ServerRequest("POST", GENERATE_ROUTE, json=body)
        if model is None:
            raise ValueError("a /v1/completions request names the served model: pass model=")
        # return_tokens_as_token_ids: the server writes "token_id:N" for each log-prob entry instead of decoding
        # every generated token once more (we read only token_ids and token_logprobs). This route always decodes
        # the log-probs, whatever `log_probs` asked.
        body = {"model": model, "prompt": list(prompt_ids), "logprobs": 0, "return_token_ids": True,
                "return_tokens_as_token_ids": True, "skip_special_tokens": False, **params}
        return ServerRequest("POST", "/v1/completions", json=body)

    def parse_samples(self, answer: Any, *, lean: bool) -> list[Completion]:
        return lean_completions(answer) if lean else openai_completions(answer)

    def score_request(self, token_ids: Sequence[int], model: str) -> ServerRequest:
        # prompt_logprobs=0: each position's entries hold the prompt's own token.
        return ServerRequest("POST", "/v1/completions", json={
            "model": model, "prompt": list(token_ids), "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0,
            "skip_special_tokens": False})

    def prompt_log_probs(self, answer: Any, token_ids: Sequence[int], start: int) -> list[float]:
        entries = answer["choices"][0]["prompt_logprobs"]
        if entries is None or len(entries) != len(token_ids):
            raise ValueError(f"no prompt log-probs for the {len(token_ids)}-token probe")
        return [float(entries[position][str(token_ids[position])]["logprob"])
                for position in range(start, len(token_ids))]

    def lean_probe_request(self) -> ServerRequest:
        return ServerRequest("GET", GENERATE_ROUTE)

    def models_request(self) -> ServerRequest:
        return ServerRequest("GET", "/v1/models")

    def served_model(self, answer: Any) -> str:
        return str(answer["data"][0]["id"])

    # ----- pause / resume -----

    def pause_request(self, mode: str) -> ServerRequest:
        return ServerRequest("POST", "/pause", params={"mode": mode})

    def resume_request(self) -> ServerRequest:
        return ServerRequest("POST", "/resume")

    # ----- weight-update protocol -----

    def world_size_request(self) -> ServerRequest:
        return ServerRequest("GET", "/get_world_size")

    def world_size(self, answer: Any) -> int:
        return int(answer["world_size"])

    def version_request(self) -> ServerRequest:
        return ServerRequest("GET", "/version")

    def server_version(self, answer: Any) -> str:
        return str(answer["version"])

    def init_transfer_request(self, init_info: Mapping[str, Any]) -> ServerRequest:
        return ServerRequest("POST", "/init_weight_transfer_engine", json={"init_info": dict(init_info)})

    def start_update_request(self) -> ServerRequest:
        return ServerRequest("POST", "/start_weight_update")

    def is_abandoned_update(self, message: str) -> bool:
        return ABANDONED_UPDATE in message

    def update_request(self, update_info: Mapping[str, Any]) -> ServerRequest:
        return ServerRequest("POST", "/update_weights", json={"update_info": dict(update_info)})

    def finish_update_request(self, version: int | None) -> ServerRequest:
        return ServerRequest("POST", "/finish_weight_update",
                             json={} if version is None else {"weight_version": str(version)})

    def reset_encoder_cache_request(self) -> ServerRequest:
        return ServerRequest("POST", "/reset_encoder_cache")

    def gloo_init_info(self, *, master_address: str, master_port: int, rank_offset: int, world_size: int,
                       timeout_s: float) -> dict[str, Any]:
        # What rollout/server_extension.py's gloo engine joins with.
        return {"master_address": master_address, "master_port": master_port, "rank_offset": rank_offset,
                "world_size": world_size, "timeout_s": timeout_s}

    def gloo_update_info(self, names: list[str], shapes: list[list[int]], dtype_name: str) -> dict[str, Any]:
        return {"names": names, "shapes": shapes, "dtype_name": dtype_name}

    def gpu_uuid_request(self) -> ServerRequest:
        return ServerRequest("POST", "/collective_rpc", json={"method": "verl_like_gpu_uuid"})

    def gpu_uuids(self, answer: Any) -> list[str]:
        return [str(uuid) for uuid in answer["results"]]

    def ipc_init_info(self, server_version: str) -> dict[str, Any]:
        from verl_like.rollout import vllm_compat

        return vllm_compat.ipc_init_info(server_version)

    def ipc_update_info(self, server_version: str, names: list[str], dtype_names: list[str],
                        shapes: list[list[int]], tensor_sizes: list[int], handles: dict[str, tuple]) -> dict[str, Any]:
        from verl_like.rollout import vllm_compat

        return vllm_compat.ipc_update_info(server_version, names, dtype_names, shapes, tensor_sizes,
                                           vllm_compat.pickle_ipc_handles(handles))


VLLM_SERVER = VLLMServerBackend()
