"""One token-level generate call for every placement: token ids in; token ids, log-probs, finish reason out.

    output = await generator.generate(request_id, prompt_ids=ids, sampling_params={"temperature": 1.0})

Async, one request at a time, cancellable (cancelling the awaiting task aborts the request in the engine).
Implementations:
- `VLLMTokenGenerator`: the in-process `vllm.LLM` of a colocated worker. Requests go into vLLM's engine as they
  arrive and the engine steps inside the event loop while any is unfinished, so one sample's tool call runs while
  the others generate (continuous batching, no lock-step turns).
- `ServerTokenGenerator`: vLLM servers (ours, through the lean route, or plain `vllm serve` through
  `/v1/completions` with token ids), via `ServerGenerator`'s clients in a thread pool; one trajectory's turns stay
  on one server (its prefix cache holds the earlier turns).
The vLLM generators take `image_data` (PIL images, one placeholder each in `prompt_ids`) on a vision-language
model and report the expanded prompt (`TokenOutput.prompt_ids`; experimental/agent_loop/vision_turns.py).
- `HFTokenGenerator`: HF `generate`, the reference (one request at a time).

`sampling_params` is verl's dict (temperature, top_p, top_k, repetition_penalty, logprobs, max_tokens, seed, ...);
`request_params` turns it into vLLM's fields. n is always 1: a multi-sample prompt is n independent requests.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

# verl's sampling_params keys we honour; "logprobs" is accepted (we always return the sampled tokens' log-probs).
_FIELDS = ("temperature", "top_p", "top_k", "max_tokens", "seed", "stop_token_ids", "ignore_eos",
           "repetition_penalty", "min_tokens")


@dataclass
class TokenOutput:
    """One generated turn: `token_ids`, their rollout `log_probs`, and vLLM's `finish_reason` ("stop", "length",
    "abort"). `stop_reason` / `num_preempted` / `routed_experts` are verl's fields of the same object.
    `weight_versions`: `(version, start, end)` per run of tokens one weight version sampled, where the engine
    labels them (servers on vLLM 0.32; a turn frozen across a weight update has two runs), else None.
    `prompt_ids`: the prompt as the engine expanded its image placeholders (turns with images), else None."""

    token_ids: list[int]
    log_probs: list[float]
    finish_reason: str | None = None
    num_preempted: int | None = None
    routed_experts: Any = None
    weight_versions: list[tuple[str, int, int]] | None = None
    prompt_ids: list[int] | None = None

    @property
    def stop_reason(self) -> str | None:
        """verl's reading of the finish reason: "aborted" when the engine aborted the request, else "completed"."""
        if self.finish_reason is None:
            return None
        return "aborted" if self.finish_reason == "abort" else "completed"


def request_params(sampling_params: dict[str, Any], prompt_len: int, max_model_len: int) -> dict[str, Any]:
    """vLLM SamplingParams fields for one request: verl's keys passed through, n=1, and max_tokens bounded by what
    the context leaves (max_model_len - prompt_len). Unknown keys raise, naming them."""
    unknown = sorted(set(sampling_params) - set(_FIELDS) - {"logprobs", "n", "do_sample"})
    if unknown:
        raise ValueError(f"generate: unknown sampling_params {unknown}; known: {sorted(_FIELDS)}")
    if sampling_params.get("n", 1) != 1:
        raise ValueError("generate: sampling_params n must be 1 (send one request per sample)")
    room = max_model_len - prompt_len
    if room < 1:
        raise ValueError(f"generate: the prompt has {prompt_len} tokens, max_model_len is {max_model_len}")
    fields = {key: sampling_params[key] for key in _FIELDS if sampling_params.get(key) is not None}
    fields["n"] = 1
    fields["max_tokens"] = min(int(fields.get("max_tokens", room)), room)
    if sampling_params.get("do_sample") is False or fields.get("temperature", 1.0) == 0:
        fields.update(temperature=0.0, top_p=1.0, top_k=0)
    if fields.get("top_k", 0) < 0:
        fields["top_k"] = 0  # verl's -1 = every token; vLLM's "no top-k" is 0 in every release we support
    fields["stop_token_ids"] = list(fields.get("stop_token_ids", ()))
    return fields


class TokenGenerator(abc.ABC):
    """What agent loops call (through `AgentLoopBase.server_manager`). `version`: the weight version the engine
    holds now (its owner updates it; each turn records it)."""

    max_model_len: int
    version: int = 0

    @abc.abstractmethod
    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       image_data: Any = None, video_data: Any = None) -> TokenOutput:
        """The next turn for `prompt_ids`; `request_id` names the trajectory (its turns may share a server)."""

    def close(self) -> None:
        """Releases what the generator holds (threads, clients); the engine or servers stay."""


def _check_text_only(image_data: Any, video_data: Any) -> None:
    if image_data or video_data:
        raise NotImplementedError("this token generator takes token ids only; images/videos are not supported here")


class VLLMTokenGenerator(TokenGenerator):
    """The in-process engine of `llm` (a `vllm.LLM`) driven request by request from one event loop.
    `lora_request`: returns the adapter every request carries (a LoRA run's current version), or None."""

    def __init__(self, llm: Any, max_model_len: int, lora_request: Callable[[], Any] | None = None,
                 vision: Any = None) -> None:
        self.llm = llm
        self.vision = vision  # a vision-language engine's VisionEngineInfo (rollout/vllm_vision.py), else None
        self.engine = llm.llm_engine
        self.max_model_len = max_model_len
        self.lora_request = lora_request
        self._pending: dict[str, asyncio.Future] = {}
        self._stepper: asyncio.Task | None = None
        self._counter = 0

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       image_data: Any = None, video_data: Any = None) -> TokenOutput:
        from vllm.inputs import TokensPrompt

        from verl_like.rollout import vllm_compat
        from verl_like.rollout.vllm import token_sampling_params

        _check_text_only(image_data if self.vision is None else None, video_data)
        fields = request_params(sampling_params, len(prompt_ids), self.max_model_len)
        prompt = TokensPrompt(prompt_token_ids=list(prompt_ids))
        if self.vision is not None:  # the placeholder is never sampled; images with one placeholder each
            from verl_like.rollout.vllm_vision import sampling_fields

            fields = sampling_fields(fields, self.vision)
            if image_data:
                prompt = TokensPrompt(prompt_token_ids=list(prompt_ids), multi_modal_data={"image": list(image_data)})
        params = token_sampling_params(fields, final_only=True)
        self._counter += 1
        rid = f"{request_id}-{self._counter}"
        future = asyncio.get_running_loop().create_future()
        internal = vllm_compat.add_engine_request(self.engine, rid, prompt, params,
                                                  self.lora_request() if self.lora_request else None)
        self._pending[rid] = future
        if internal != rid:
            self._pending[internal] = future
        if self._stepper is None or self._stepper.done():
            self._stepper = asyncio.get_running_loop().create_task(self._step_until_idle())
        try:
            return await future
        except asyncio.CancelledError:
            self.engine.abort_request([rid])
            self._forget(future)
            raise

    def _forget(self, future: asyncio.Future) -> None:
        for key in [k for k, f in self._pending.items() if f is future]:
            del self._pending[key]

    async def _step_until_idle(self) -> None:
        from verl_like.rollout import vllm_compat

        try:
            while self._pending:
                for output in self.engine.step():
                    if not output.finished:
                        continue
                    future = self._pending.get(output.request_id)
                    if future is None:
                        continue
                    self._forget(future)
                    sample = output.outputs[0]
                    tokens = list(sample.token_ids)
                    if not future.done():
                        expanded = list(output.prompt_token_ids) if self.vision is not None else None
                        future.set_result(TokenOutput(tokens, vllm_compat.sampled_logprobs(tokens, sample.logprobs),
                                                      sample.finish_reason, getattr(output, "num_preempted", None),
                                                      prompt_ids=expanded))
                await asyncio.sleep(0)  # let tool calls and new requests in between engine steps
        except BaseException as err:  # an engine failure fails every waiting request, not only one
            for future in set(self._pending.values()):
                if not future.done():
                    future.set_exception(RuntimeError(f"vLLM engine step failed: {type(err).__name__}: {err}"))
            self._pending.clear()
            if not isinstance(err, Exception):
                raise


class ServerTokenGenerator(TokenGenerator):
    """vLLM servers through `servers` (a `ServerGenerator`); `max_concurrent` requests in flight at once."""

    def __init__(self, servers: Any, max_model_len: int, max_concurrent: int = 256) -> None:
        self.servers = servers
        self.max_model_len = max_model_len
        self._pool = ThreadPoolExecutor(max_workers=max_concurrent, thread_name_prefix="agent-http")
        self._sticky: dict[str, int] = {}

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       image_data: Any = None, video_data: Any = None) -> TokenOutput:
        _check_text_only(None, video_data)
        fields = request_params(sampling_params, len(prompt_ids), self.max_model_len)
        loop = asyncio.get_running_loop()
        completions = await loop.run_in_executor(
            self._pool, self.servers.complete_on, list(prompt_ids), fields, self._sticky, request_id,
            list(image_data) if image_data else None)
        sample = completions[0]
        return TokenOutput(list(sample.token_ids), list(sample.log_probs), sample.finish_reason,
                           weight_versions=sample.weight_versions, prompt_ids=sample.prompt_token_ids)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class HFTokenGenerator(TokenGenerator):
    """HF `generate` (an `HFRolloutEngine`), one request at a time in a worker thread: the reference."""

    def __init__(self, engine: Any, max_model_len: int) -> None:
        self.engine = engine
        self.max_model_len = max_model_len
        self._lock = threading.Lock()

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       image_data: Any = None, video_data: Any = None) -> TokenOutput:
        _check_text_only(image_data, video_data)
        fields = request_params(sampling_params, len(prompt_ids), self.max_model_len)
        return await asyncio.get_running_loop().run_in_executor(None, self._generate, list(prompt_ids), fields)

    def _generate(self, prompt_ids: list[int], fields: dict[str, Any]) -> TokenOutput:
        import torch

        from verl_like.protocol import DataProto
        from verl_like.rollout.base import SamplingConfig

        greedy = fields.get("temperature", 1.0) == 0
        sampling = SamplingConfig(
            n=1, temperature=fields.get("temperature", 1.0) if not greedy else 1.0, top_p=fields.get("top_p", 1.0),
            top_k=fields.get("top_k") or None, max_tokens=fields["max_tokens"], seed=fields.get("seed"),
            stop_token_ids=tuple(fields["stop_token_ids"]), ignore_eos=bool(fields.get("ignore_eos", False)),
            do_sample=not greedy,
        )
        ids = torch.tensor([prompt_ids], dtype=torch.long)
        prompts = DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                               "position_ids": torch.arange(ids.shape[1]).unsqueeze(0)})
        with self._lock:
            out = self.engine.generate(prompts, sampling)
        length = int(out.batch["response_mask"][0].sum())
        tokens = out.batch["responses"][0, :length].tolist()
        stopped = length < sampling.max_tokens or (tokens and tokens[-1] in self.engine.eos_token_ids)
        return TokenOutput(tokens, out.batch["rollout_log_probs"][0, :length].tolist(),
                           "stop" if stopped else "length")
