"""Scores given sequences with an in-process `vllm.LLM` (prompt log-probs): a teacher's top-k, and the sync check's
probe (`score_token_log_probs`).

The whole sequence (prompt + response) goes to vLLM as a prompt with `prompt_logprobs=k` and one generated token
(discarded); position j of the prompt log-probs is the teacher's distribution over token j given the tokens
before it. For response token t of a row whose prompt has P valid tokens that is position P + t. The engine is
built with `max_logprobs=k` (vLLM's default cap is 20) and no prefix caching (prompt log-probs need the
prompt computed, not served from cache).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import torch

from verl_like.engine.model_outputs import response_mask_of
from verl_like.protocol import DataProto
from verl_like.rollout import vllm_compat

logger = logging.getLogger(__name__)


def scoring_params(final_only: bool = False):
    """SamplingParams that score a sequence given as the prompt: each position's own token's log-prob
    (temperature 1, no top-k/top-p: prompt log-probs are the raw log-softmax) and one generated token, taken
    greedily so that scoring draws nothing from the engine's random state (the token is discarded). Flat layout
    where the release has it; `final_only`: one output when the request ends (a server route)."""
    from vllm import SamplingParams

    extra = {}
    if final_only:
        from vllm.sampling_params import RequestOutputKind

        extra["output_kind"] = RequestOutputKind.FINAL_ONLY
    return SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False,
                          **vllm_compat.flat_logprobs_kwargs(), **extra)


def score_token_log_probs(llm, token_ids: list[int], start: int, lora_request=None) -> list[float]:
    """The log-prob (temperature 1, no top-k/top-p) of each token start.. of `token_ids` given the tokens before
    it, from one forward of the engine (prompt log-probs are computed, never served from the prefix cache)."""
    from vllm.inputs import TokensPrompt

    if not 0 < start < len(token_ids):
        raise ValueError(f"score_token_log_probs: start={start} must lie in (0, {len(token_ids)})")
    output = llm.generate([TokensPrompt(prompt_token_ids=list(token_ids))], scoring_params(), use_tqdm=False,
                          lora_request=lora_request)[0]
    return vllm_compat.prompt_token_logprobs(output.prompt_logprobs, list(token_ids), start)


def rescore_samples(llm, prompts: list[list[int]], responses: list[list[int]], lora_request=None) -> list[list[float]]:
    """Each response's tokens' log-probs (temperature 1, no top-k/top-p) given its prompt and the tokens before
    it, from one prompt-log-prob pass of the engine over every prompt + response (rollout.log_probs_from=rescore).
    An empty response gets an empty list."""
    from vllm.inputs import TokensPrompt

    if len(prompts) != len(responses):
        raise ValueError(f"rescore_samples: {len(prompts)} prompts for {len(responses)} responses")
    rows = [row for row, response in enumerate(responses) if response]
    sequences = [list(prompts[row]) + list(responses[row]) for row in rows]
    outputs = llm.generate([TokensPrompt(prompt_token_ids=sequence) for sequence in sequences], scoring_params(),
                           use_tqdm=False, lora_request=lora_request)
    scored: list[list[float]] = [[] for _ in responses]
    for row, sequence, output in zip(rows, sequences, outputs):
        scored[row] = vllm_compat.prompt_token_logprobs(output.prompt_logprobs, sequence, len(prompts[row]))
    return scored


@dataclass(frozen=True)
class TeacherEngineOptions:
    """How the teacher's `vllm.LLM` is built: top_k (log-probs per position), dtype, gpu_memory_utilization,
    max_model_len (None: the model's), trust_remote_code, seed."""

    top_k: int = 8
    dtype: str = "float32"
    gpu_memory_utilization: float = 0.2
    max_model_len: int | None = None
    trust_remote_code: bool = False
    seed: int = 0


class VLLMTopKScorer:
    """Scores sequences with a teacher model: `topk(batch)` -> "teacher_topk_ids" / "teacher_topk_log_probs"."""

    def __init__(self, model_path: str | os.PathLike, options: TeacherEngineOptions) -> None:
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0":
            raise RuntimeError("VLLMTopKScorer runs vLLM in-process: set VLLM_ENABLE_V1_MULTIPROCESSING=0 first")
        from vllm import LLM

        self.options = options
        start = time.perf_counter()
        kwargs = dict(
            model=str(model_path),
            distributed_executor_backend="uni",
            dtype=options.dtype,
            gpu_memory_utilization=options.gpu_memory_utilization,
            enable_prefix_caching=False,
            enforce_eager=True,
            max_logprobs=options.top_k,
            seed=options.seed,
            trust_remote_code=options.trust_remote_code,
        )
        if options.max_model_len is not None:
            kwargs["max_model_len"] = options.max_model_len
        with vllm_compat.worker_env_left_behind_removed():
            self.llm = LLM(**kwargs)
        logger.info("teacher vLLM engine for %s ready in %.1f s", model_path, time.perf_counter() - start)

    def topk(self, batch: DataProto) -> DataProto:
        """The teacher's top-k at every response position of `batch` (the rollout's layout: left-padded prompts,
        right-padded responses): "teacher_topk_ids" (long) and "teacher_topk_log_probs" (float32), both
        `(batch, response_len, k)`, most likely first; zeros where the response mask is 0."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        tensors = batch.batch
        responses = tensors["responses"]
        response_len = responses.shape[1]
        mask = response_mask_of(tensors).bool()
        prompt_mask = tensors["attention_mask"][:, :-response_len].bool()
        prompt_ids = tensors["input_ids"][:, :-response_len]
        requests, prompt_lens, lengths = [], [], []
        for row in range(len(batch)):
            prompt = prompt_ids[row][prompt_mask[row]].tolist()
            length = int(mask[row].sum())
            if not bool(mask[row, :length].all()):
                raise ValueError(f"row {row}: the response mask has holes; the teacher scores a contiguous response")
            requests.append(TokensPrompt(prompt_token_ids=prompt + responses[row, :length].tolist()))
            prompt_lens.append(len(prompt))
            lengths.append(length)
        k = self.options.top_k
        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=k, detokenize=False)
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        ids = torch.zeros((len(batch), response_len, k), dtype=torch.long)
        log_probs = torch.zeros((len(batch), response_len, k), dtype=torch.float32)
        for row, output in enumerate(outputs):
            for t in range(lengths[row]):
                token_ids, values = vllm_compat.prompt_topk_logprobs(output.prompt_logprobs, prompt_lens[row] + t, k)
                ids[row, t] = torch.tensor(token_ids)
                log_probs[row, t] = torch.tensor(values)
        return DataProto.from_dict(tensors={"teacher_topk_ids": ids, "teacher_topk_log_probs": log_probs})

    def shutdown(self) -> None:
        del self.llm
