"""Log-probs of sampled tokens after the sampler's processing (temperature, then top-k, then top-p).

The same order and tie rules as vLLM's sampler with `logprobs_mode="processed_logprobs"` (and HF's warpers):
top-k keeps every token whose logit is >= the k-th largest; top-p sorts ascending and drops the tokens whose
cumulative probability is <= 1 - top_p, always keeping the most likely one; top-p sees the top-k-filtered
distribution. Greedy decoding returns the plain log-softmax, as vLLM does.
"""

from __future__ import annotations

import torch

from verl_like.rollout.base import SamplingConfig


def processed_log_probs(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Log-softmax of the processed logits, float32, (..., vocab) -> (..., vocab); filtered tokens get -inf."""
    scores = logits.float()
    if sampling.greedy:
        return torch.log_softmax(scores, dim=-1)
    scores = scores / sampling.temperature
    vocab = scores.shape[-1]
    if sampling.top_k is not None and sampling.top_k < vocab:
        kth_largest = torch.topk(scores, sampling.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth_largest, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=False)
        cumulative = torch.softmax(sorted_scores, dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative <= 1.0 - sampling.top_p
        drop_sorted[..., -1] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return torch.log_softmax(scores, dim=-1)


def sampled_token_log_probs(logits: torch.Tensor, tokens: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Processed log-prob of `tokens` under `logits`: (..., vocab), (...) -> (...) float32."""
    log_probs = processed_log_probs(logits, sampling)
    return log_probs.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)
