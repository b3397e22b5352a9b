"""Generation through servers that fail: the session's vLLM server (`python -m verl_like.serve`, fault hooks on) and
a listener that accepts connections and never answers.

- A server answering HTTP 500 for a while: each request is retried with backoff and the rollout samples what an
  undisturbed one does (same seeds); past `request_retries` the rollout fails naming the server and the status.
- A server that cannot make progress: a request fails within `request_timeout_s`, naming the server.
"""

from __future__ import annotations

import socket
import time

import httpx
import pytest

pytest.importorskip("vllm")

from batch_helpers import prompt_batch  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from verl_like.protocol import DataProto  # noqa: E402
from verl_like.rollout.base import SamplingConfig  # noqa: E402
from verl_like.rollout.server_client import ServerClient, ServerError  # noqa: E402
from verl_like.rollout.server_generate import FAULT_ROUTE  # noqa: E402
from verl_like.rollout.servers import ServerGenerator  # noqa: E402

SAMPLING = SamplingConfig(n=2, temperature=1.0, max_tokens=8, seed=5)


@pytest.fixture(scope="module")
def prompts(warmstart_model) -> DataProto:
    tokenizer = AutoTokenizer.from_pretrained(warmstart_model)
    return prompt_batch(tokenizer, [f"sort {n}" for n in (4021, 973, 51820, 660, 18, 7305)])


def arm_http_500(address: str, seconds: float) -> None:
    httpx.post(address + FAULT_ROUTE, json={"http_500_for_s": seconds}, timeout=30).raise_for_status()


def test_http_500_for_a_while_is_retried_with_backoff_and_samples_the_same(vllm_server, prompts):
    servers = ServerGenerator([ServerClient(vllm_server, "server 0", timeout_s=60)], pad_token_id=0,
                            request_retries=6, retry_backoff_s=0.25)
    try:
        reference = servers.generate(prompts, SAMPLING)
        assert reference.meta_info["metrics"]["rollout/requests_retried"] == 0.0
        arm_http_500(vllm_server, 1.5)
        start = time.monotonic()
        retried = servers.generate(prompts, SAMPLING)
        assert time.monotonic() - start >= 1.5
        # every request met the fault: 0.25 + 0.5 + 1.0 s of backoff covers it
        assert retried.meta_info["metrics"]["rollout/requests_retried"] >= len(prompts)
        assert (retried.batch["responses"] == reference.batch["responses"]).all()
        assert (retried.batch["rollout_log_probs"] == reference.batch["rollout_log_probs"]).all()
    finally:
        arm_http_500(vllm_server, 0)
        servers.close()


def test_retries_of_http_500_are_bounded_and_the_error_names_the_server(vllm_server, prompts):
    servers = ServerGenerator([ServerClient(vllm_server, "server 0", timeout_s=60)], pad_token_id=0,
                            request_retries=2, retry_backoff_s=0.1)
    try:
        arm_http_500(vllm_server, 60)
        start = time.monotonic()
        with pytest.raises(ServerError, match=rf"server 0 \({vllm_server}\): POST /verl_like/generate answered "
                                              r"HTTP 500.*fault hook"):
            servers.generate(prompts, SAMPLING)
        assert time.monotonic() - start < 10  # 0.1 + 0.2 s of backoff, 3 attempts
    finally:
        arm_http_500(vllm_server, 0)
        servers.close()


def test_a_server_that_cannot_make_progress_fails_within_request_timeout_naming_it(prompts):
    listener = socket.socket()  # accepts connections (the kernel's backlog) and never answers
    listener.bind(("127.0.0.1", 0))
    listener.listen(512)
    address = f"http://127.0.0.1:{listener.getsockname()[1]}"
    servers = ServerGenerator([ServerClient(address, "server 2", timeout_s=3)], pad_token_id=0, request_timeout_s=3)
    try:
        start = time.monotonic()
        with pytest.raises(ServerError, match=rf"server 2 \({address}\): (GET|POST) /verl_like/generate timed out "
                                              r"after 3 s \(ReadTimeout\)"):
            servers.generate(prompts, SAMPLING)
        assert time.monotonic() - start < 3 + 2
    finally:
        servers.close()
        listener.close()
