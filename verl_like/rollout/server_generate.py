"""The lean generation route of our vLLM servers: token ids in, token ids and sampled log-probs out, nothing else.

vLLM's OpenAI `/v1/completions` detokenizes every generated token (twice with log-probs: the text and one token
string per log-prob entry), keeps one dict and one `Logprob` object per token, and writes per-token lists of
strings, offsets and top-log-prob dicts into the JSON answer. A rollout reads none of that. Measured on one H200
(docs/benchmarks.md, "Server mode"), a server on the trainer's GPU generated at half the rate of the in-process
engine on the same batch, which skips all of it (`detokenize=False`, flat log-probs).

`verl_like.serve` adds this module's `generate_route` to the server with vLLM's own `--middleware` flag (an HTTP
middleware of the server's FastAPI app, in the server's front process). It answers

    POST /verl_like/generate  {"prompt_token_ids": [int, ...], "params": {vLLM SamplingParams fields},
                               "lora_name": str (on a LoRA server: required, a loaded adapter; rollout/server_lora.py),
                               "log_probs": "decode" (default) | "rescore" | "none"}
      -> {"samples": [{"token_ids": b64 int32, "log_probs": b64 float32, "finish_reason": str | null,
                       "weight_versions": [[version, start, end], ...] | null}, ...]}

    GET  /verl_like/generate  -> {"version": 1}   (clients probe it; a server without it answers 404)

through the same engine client the OpenAI routes use, so `/pause`, `/resume` and the weight updates act on these
requests as on any other. `weight_versions` (vLLM releases that label them, see vllm_compat) are the runs of
output tokens each weight version sampled: a request frozen across an update (partial rollout) has two.
Image prompts take `POST /verl_like/generate_images` (rollout/server_vision.py). Every other path passes through
untouched.

"log_probs" says how the sampled tokens' log-probs are made (rollout.log_probs_from, calculate_log_probs): by the
decode (vLLM's per-token log-probs), by rescoring (the decode asks for none; once the samples are finished each is
scored as a prompt, `prompt_logprobs=0`, in one more request of the same engine, all of a prompt's samples at once,
before the request answers; only for temperature-1 or greedy sampling without top-k/top-p, else HTTP 400), or not
at all (empty arrays).

Fault hook (tests; only in a server started with VERL_LIKE_FAULT_HOOKS=1, else 404):

    POST /verl_like/fault  {"http_500_for_s": float}  -> the generation route answers HTTP 500 for that long
"""

from __future__ import annotations

import base64
import os
import time
import uuid
from typing import Any

import numpy as np

ROUTE = "/verl_like/generate"
FAULT_ROUTE = "/verl_like/fault"
VISION_ROUTE = "/verl_like/generate_images"  # image prompts: rollout/server_vision.py
FAULT_HOOKS_ENV = "VERL_LIKE_FAULT_HOOKS"
VERSION = 1
_faults = {"http_500_until": 0.0}  # this server process's armed faults (monotonic deadlines)
# The sampling fields a client may set (SamplingConfig.vllm_fields); log-probs, detokenization and the output
# kind are fixed here.
SAMPLING_FIELDS = ("n", "max_tokens", "temperature", "top_p", "top_k", "ignore_eos", "stop_token_ids", "seed",
                   "repetition_penalty", "min_tokens")  # the last two: agent loops (verl's sampling_params)


def encode_array(values: list[float] | list[int], dtype: str) -> str:
    """`values` as base64 of little-endian `dtype` ("<i4" or "<f4")."""
    return base64.b64encode(np.asarray(values, dtype=dtype).tobytes()).decode("ascii")


def decode_array(text: str, dtype: str) -> np.ndarray:
    """The inverse of `encode_array`."""
    return np.frombuffer(base64.b64decode(text), dtype=dtype)


def sampling_params(params: dict[str, Any], log_probs: bool = True, **fixed: Any) -> Any:
    """The in-process engine's SamplingParams (`token_sampling_params`) for a request's `params`
    (`SamplingConfig.vllm_fields`) plus the route's own `fixed` fields, one answer when the request ends, the
    sampled tokens' log-probs only with `log_probs`. Unknown fields raise ValueError naming them."""
    from verl_like.rollout.vllm import token_sampling_params

    unknown = sorted(set(params) - set(SAMPLING_FIELDS))
    if unknown:
        raise ValueError(f"unknown sampling fields {unknown}; this route takes {list(SAMPLING_FIELDS)}")
    return token_sampling_params({**params, **fixed}, final_only=True, log_probs=log_probs)


LOG_PROBS_MODES = ("decode", "rescore", "none")


def finished_samples(output: Any) -> list[Any]:
    """The samples of vLLM's final `RequestOutput`, in sample order."""
    return sorted(output.outputs, key=lambda sample: sample.index)


def encode_output(output: Any, rescored: list[list[float]] | None = None, log_probs: bool = True
                  ) -> list[dict[str, Any]]:
    """The samples of vLLM's final `RequestOutput`, in sample order, with their sampled tokens' log-probs: the
    decode's, `rescored` (one list per sample) when given, none (empty arrays) when not `log_probs`."""
    from verl_like.rollout import vllm_compat

    samples = []
    for index, sample in enumerate(finished_samples(output)):
        tokens = list(sample.token_ids)
        if rescored is not None:
            log_probs_of = rescored[index]
        elif log_probs and tokens:
            log_probs_of = vllm_compat.sampled_logprobs(tokens, sample.logprobs)
        else:
            log_probs_of = []
        samples.append({
            "token_ids": encode_array(tokens, "<i4"),
            "log_probs": encode_array(log_probs_of, "<f4"),
            "finish_reason": sample.finish_reason,
            "weight_versions": vllm_compat.weight_version_spans(sample),
        })
    return samples


async def generate_route(request: Any, call_next: Any) -> Any:
    """vLLM `--middleware`: serves ROUTE (and FAULT_ROUTE when enabled), hands every other request on."""
    if request.url.path == FAULT_ROUTE and os.environ.get(FAULT_HOOKS_ENV) == "1":
        return await fault_route(request)
    if request.url.path == VISION_ROUTE:
        from verl_like.rollout.server_vision import vision_route

        return await vision_route(request)
    if request.url.path != ROUTE:
        return await call_next(request)
    from starlette.responses import JSONResponse

    from verl_like.config.rollout import rescorable
    from verl_like.rollout.server_lora import lora_request_for

    if request.method == "GET":
        return JSONResponse({"version": VERSION})
    if time.monotonic() < _faults["http_500_until"]:
        return JSONResponse({"error": "fault hook: answering HTTP 500 (POST /verl_like/fault)"}, status_code=500)
    try:
        body = await request.json()
        prompt = [int(token) for token in body["prompt_token_ids"]]
        mode = body.get("log_probs", "decode")
        if mode not in LOG_PROBS_MODES:
            raise ValueError(f"log_probs={mode!r} is not one of {LOG_PROBS_MODES}")
        params = sampling_params(dict(body.get("params") or {}), log_probs=mode == "decode")
        if mode == "rescore" and not rescorable(params.temperature, params.top_p, params.top_k, True):
            raise ValueError(f"log_probs='rescore' gives temperature-1 log-probs of every token; got temperature="
                             f"{params.temperature}, top_p={params.top_p}, top_k={params.top_k}")
        lora_request = lora_request_for(request.app, body.get("lora_name"))
    except (KeyError, TypeError, ValueError) as err:
        return JSONResponse({"error": f"bad {ROUTE} request: {type(err).__name__}: {err}"}, status_code=400)
    engine = request.app.state.engine_client
    final = await generate_to_end(engine, {"prompt_token_ids": prompt}, params, f"verl_like-{uuid.uuid4().hex}",
                                  lora_request)
    if isinstance(final, JSONResponse):
        return final
    rescored = None
    if mode == "rescore":
        rescored = await rescore(engine, prompt, [list(s.token_ids) for s in finished_samples(final)], lora_request)
        if isinstance(rescored, JSONResponse):
            return rescored
    return JSONResponse({"samples": encode_output(final, rescored, log_probs=mode != "none")})


async def rescore(engine: Any, prompt: list[int], responses: list[list[int]], lora_request: Any) -> Any:
    """Each response's tokens' log-probs given `prompt` (temperature 1), every response scored as a prompt in a
    request of its own, all at once; or the JSONResponse of the first failure."""
    import asyncio

    from starlette.responses import JSONResponse

    from verl_like.rollout import vllm_compat
    from verl_like.rollout.vllm_scoring import scoring_params

    params = scoring_params(final_only=True)

    async def score(response: list[int]) -> Any:
        if not response:
            return []
        sequence = prompt + response
        final = await generate_to_end(engine, {"prompt_token_ids": sequence}, params,
                                      f"verl_like-score-{uuid.uuid4().hex}", lora_request)
        if isinstance(final, JSONResponse):
            return final
        return vllm_compat.prompt_token_logprobs(final.prompt_logprobs, sequence, len(prompt))

    scored = await asyncio.gather(*(score(response) for response in responses))
    failed = next((answer for answer in scored if not isinstance(answer, list)), None)
    return failed if failed is not None else list(scored)


async def generate_to_end(engine: Any, inputs: dict[str, Any], params: Any, request_id: str, lora_request: Any,
                          bad_input: tuple[type[Exception], ...] = (), route: str = ROUTE) -> Any:
    """The request's final output, or the JSONResponse of its failure: 400 for `bad_input` errors (vLLM refused
    the inputs: not retried), 500 otherwise (the engine failed: the client retries and raises naming the server)."""
    from starlette.responses import JSONResponse

    final = None
    try:
        async for output in engine.generate(inputs, params, request_id, lora_request=lora_request):
            final = output
    except bad_input as err:
        return JSONResponse({"error": f"bad {route} request: {type(err).__name__}: {err}"}, status_code=400)
    except Exception as err:  # the engine died or refused the request: the client raises naming this server
        return JSONResponse({"error": f"generation failed: {type(err).__name__}: {err}"}, status_code=500)
    if final is None:
        return JSONResponse({"error": "generation ended without an output"}, status_code=500)
    return final


async def fault_route(request: Any) -> Any:
    """Arms the faults the body names (module doc)."""
    from starlette.responses import JSONResponse

    body = await request.json()
    _faults["http_500_until"] = time.monotonic() + float(body.get("http_500_for_s", 0.0))
    return JSONResponse({"armed": body})
