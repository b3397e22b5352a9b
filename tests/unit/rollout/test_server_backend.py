"""The server-backend interface: VLLMServerBackend builds vLLM's requests without a server, and a ServerClient
sends whatever its backend builds (a stand-in backend and httpx's MockTransport)."""

from __future__ import annotations

import sys

import httpx
import pytest

from verl_like.config.loader import load_config
from verl_like.rollout.server_backend import ServerRequest
from verl_like.rollout.server_client import ServerClient, ServerError
from verl_like.rollout.server_generate import ROUTE, encode_array
from verl_like.rollout.vllm_server import VLLM_SERVER, VLLMServerBackend

PARAMS = {"n": 2, "max_tokens": 4, "seed": 7}


def test_the_lean_generate_request_carries_token_ids_params_and_the_adapter():
    request = VLLM_SERVER.generate_request([1, 2, 3], PARAMS, lean=True, adapter="policy-1-v3")
    assert (request.method, request.route) == ("POST", ROUTE)
    assert request.json == {"prompt_token_ids": [1, 2, 3], "params": PARAMS, "lora_name": "policy-1-v3"}
    assert "lora_name" not in VLLM_SERVER.generate_request([1], PARAMS, lean=True).json


@pytest.mark.parametrize("mode", ["rescore", "none"])
def test_the_log_probs_field_moves_out_of_the_params_into_the_lean_body(mode):
    params = {**PARAMS, VLLM_SERVER.LOG_PROBS_FIELD: mode}
    lean = VLLM_SERVER.generate_request([1, 2], params, lean=True).json
    assert lean["log_probs"] == mode and lean["params"] == PARAMS
    decode = VLLM_SERVER.generate_request([1, 2], {**PARAMS, VLLM_SERVER.LOG_PROBS_FIELD: "decode"}, lean=True).json
    assert "log_probs" not in decode and decode["params"] == PARAMS  # the route's default
    # vLLM's completion route always decodes them; the field never reaches it.
    openai = VLLM_SERVER.generate_request([1, 2], params, lean=False, model="tiny").json
    assert "log_probs" not in openai and openai["logprobs"] == 0
    assert params[VLLM_SERVER.LOG_PROBS_FIELD] == mode  # the caller's dict is left as it was


def test_the_completions_request_names_the_model_and_asks_for_token_ids_back():
    request = VLLM_SERVER.generate_request([5, 6], PARAMS, lean=False, model="tiny")
    assert (request.method, request.route) == ("POST", "/v1/completions")
    body = request.json
    assert body["model"] == "tiny" and body["prompt"] == [5, 6] and body["return_token_ids"]
    assert body["logprobs"] == 0 and body["n"] == 2 and body["seed"] == 7
    with pytest.raises(ValueError, match="names the served model"):
        VLLM_SERVER.generate_request([5], PARAMS, lean=False)


def test_samples_are_read_in_sample_order_from_either_route():
    lean = {"samples": [{"token_ids": encode_array([4, 5], "<i4"), "log_probs": encode_array([-0.5, -1.0], "<f4"),
                         "finish_reason": "length", "weight_versions": [["3", 0, 2]]}]}
    (sample,) = VLLM_SERVER.parse_samples(lean, lean=True)
    assert sample.token_ids == [4, 5] and sample.log_probs == [-0.5, -1.0] and sample.weight_versions == [("3", 0, 2)]
    openai = {"choices": [
        {"index": 1, "token_ids": [9], "logprobs": {"token_logprobs": [-2.0]}, "finish_reason": "stop"},
        {"index": 0, "token_ids": [7, 8], "logprobs": {"token_logprobs": [-1.0, -1.5]}, "finish_reason": "length"},
    ]}
    assert [s.token_ids for s in VLLM_SERVER.parse_samples(openai, lean=False)] == [[7, 8], [9]]
    openai["choices"][0]["logprobs"]["token_logprobs"] = []
    with pytest.raises(ValueError, match="0 log-probs for 1 tokens"):
        VLLM_SERVER.parse_samples(openai, lean=False)


def test_pause_resume_and_the_update_round_are_vllms_endpoints():
    assert VLLM_SERVER.pause_request("keep") == ServerRequest("POST", "/pause", params={"mode": "keep"})
    assert VLLM_SERVER.resume_request() == ServerRequest("POST", "/resume")
    assert VLLM_SERVER.start_update_request() == ServerRequest("POST", "/start_weight_update")
    assert VLLM_SERVER.finish_update_request(4).json == {"weight_version": "4"}
    assert VLLM_SERVER.finish_update_request(None).json == {}  # closing an update a dead sender left open
    info = VLLM_SERVER.gloo_update_info(["w"], [[2, 3]], "bfloat16")
    assert VLLM_SERVER.update_request(info).json == {"update_info": {"names": ["w"], "shapes": [[2, 3]],
                                                                     "dtype_name": "bfloat16"}}
    init = VLLM_SERVER.gloo_init_info(master_address="10.0.0.1", master_port=29500, rank_offset=3, world_size=5,
                                      timeout_s=60.0)
    assert VLLM_SERVER.init_transfer_request(init).json["init_info"]["rank_offset"] == 3
    assert VLLM_SERVER.is_abandoned_update("... weight update is already active. Call finish_weight_update first.")


def test_the_launch_command_runs_verl_like_serve_with_the_engine_flags_last():
    rollout = load_config(["actor_rollout_ref.rollout.mode=server",
                           "actor_rollout_ref.rollout.server.extra_args=[--max-num-seqs,8]"]).actor_rollout_ref.rollout
    flags = VLLM_SERVER.engine_args(rollout, adapter_rank=8, adapter_window=3)
    assert flags[-9:-7] == ["--max-num-seqs", "8"]  # the user's extra_args, then the adapter flags
    assert flags[-7:] == ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "3", "--max-cpu-loras", "3"]
    command = VLLM_SERVER.launch_command("/m", port=8001, host="127.0.0.1", tensor_parallel_size=2, device="cpu",
                                         extra_args=flags)
    assert command[:4] == [sys.executable, "-m", "verl_like.serve", "/m"]
    assert command[command.index("--tensor-parallel-size") + 1] == "2" and command[-len(flags):] == flags


class RenamedRoutes(VLLMServerBackend):
    """Another server's protocol, as a stand-in: vLLM's with its own pause and start routes."""

    label = "stand-in"

    def pause_request(self, mode: str) -> ServerRequest:
        return ServerRequest("POST", "/pause_generation", json={"abort": mode == "abort"})

    def start_update_request(self) -> ServerRequest:
        return ServerRequest("POST", "/begin")

    def is_abandoned_update(self, message: str) -> bool:
        return "still open" in message


def test_a_client_sends_what_its_backend_builds():
    seen: list[tuple[str, str, bytes]] = []

    def server(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path, request.content))
        if request.url.path == "/begin" and len(seen) == 1:
            return httpx.Response(500, json={"error": "an update is still open"})
        return httpx.Response(200, json={})

    client = ServerClient("http://stand-in:1", "server 0", backend=RenamedRoutes())
    client._local.client = httpx.Client(base_url=client.address, transport=httpx.MockTransport(server))
    client.start_weight_update()  # refused as abandoned by this backend's own message: finished, started again
    client.pause("abort")
    assert [path for _, path, _ in seen] == ["/begin", "/finish_weight_update", "/begin", "/pause_generation"]
    assert b'"abort"' in seen[-1][2] and b"true" in seen[-1][2]


def test_a_completion_whose_log_probs_do_not_match_its_tokens_fails_naming_the_server():
    def server(request: httpx.Request) -> httpx.Response:
        if request.url.path == ROUTE:  # a plain `vllm serve`: no lean route
            return httpx.Response(404)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny"}]})
        return httpx.Response(200, json={"choices": [
            {"index": 0, "token_ids": [1, 2], "logprobs": {"token_logprobs": [-1.0]}, "finish_reason": "length"}]})

    client = ServerClient("http://plain:1", "server 3")
    client._local.client = httpx.Client(base_url=client.address, transport=httpx.MockTransport(server))
    with pytest.raises(ServerError, match=r"server 3 \(http://plain:1\): 1 log-probs for 2 tokens"):
        client.complete([5], PARAMS)


def test_the_sync_checks_scoring_request_reads_the_prompts_own_tokens():
    request = VLLM_SERVER.score_request([3, 4, 5], "tiny")
    assert request.route == "/v1/completions" and request.json["prompt_logprobs"] == 0
    answer = {"choices": [{"prompt_logprobs": [None, {"4": {"logprob": -0.25}}, {"5": {"logprob": -2.0}}]}]}
    assert VLLM_SERVER.prompt_log_probs(answer, [3, 4, 5], 1) == [-0.25, -2.0]
    with pytest.raises(ValueError, match="no prompt log-probs for the 3-token probe"):
        VLLM_SERVER.prompt_log_probs({"choices": [{"prompt_logprobs": None}]}, [3, 4, 5], 1)
