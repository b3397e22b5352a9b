"""Processed log-probs (temperature -> top-k -> top-p) against a float64 plain-loop reference."""

import math

import pytest
import torch

from verl_like.rollout.base import SamplingConfig
from verl_like.rollout.logprobs import processed_log_probs, sampled_token_log_probs


def reference_log_probs(row: list[float], sampling: SamplingConfig) -> list[float]:
    """One vocab row, float64, written with loops only."""
    if sampling.greedy:
        scores = list(row)
    else:
        scores = [x / sampling.temperature for x in row]
        if sampling.top_k is not None and sampling.top_k < len(scores):
            kth = sorted(scores, reverse=True)[sampling.top_k - 1]
            scores = [x if x >= kth else -math.inf for x in scores]
        if sampling.top_p < 1.0:
            order = sorted(range(len(scores)), key=lambda i: scores[i])  # ascending
            finite_max = max(scores)
            exps = [math.exp(scores[i] - finite_max) if scores[i] > -math.inf else 0.0 for i in order]
            total = sum(exps)
            cumulative = 0.0
            dropped = set()
            for rank, index in enumerate(order):
                cumulative += exps[rank] / total
                if cumulative <= 1.0 - sampling.top_p and rank != len(order) - 1:
                    dropped.add(index)
            scores = [-math.inf if i in dropped else x for i, x in enumerate(scores)]
    finite_max = max(scores)
    log_total = finite_max + math.log(sum(math.exp(x - finite_max) for x in scores if x > -math.inf))
    return [x - log_total if x > -math.inf else -math.inf for x in scores]


SAMPLINGS = [
    SamplingConfig(do_sample=False),
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.7),
    SamplingConfig(temperature=1.3, top_k=5),
    SamplingConfig(temperature=0.7, top_p=0.8),
    SamplingConfig(temperature=0.9, top_k=7, top_p=0.6),
    SamplingConfig(top_k=1),
    SamplingConfig(top_p=0.05),
]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=repr)
def test_processed_log_probs_match_float64_reference(sampling):
    torch.manual_seed(0)
    logits = torch.randn(3, 4, 20) * 2
    got = processed_log_probs(logits, sampling)
    assert got.dtype == torch.float32 and got.shape == logits.shape
    for b in range(3):
        for t in range(4):
            want = reference_log_probs(logits[b, t].double().tolist(), sampling)
            for v, (g, w) in enumerate(zip(got[b, t].tolist(), want)):
                if w == -math.inf:
                    assert g == -math.inf, (b, t, v)
                else:
                    assert abs(g - w) < 1e-5, (b, t, v, g, w)


def test_top_k_keeps_ties_with_the_kth_logit():
    logits = torch.tensor([[3.0, 1.0, 1.0, 0.0]])
    got = processed_log_probs(logits, SamplingConfig(top_k=2))
    assert torch.isfinite(got[0, :3]).all() and got[0, 3] == -math.inf


def test_top_p_always_keeps_the_most_likely_token():
    logits = torch.tensor([[5.0, 0.0, -1.0]])
    got = processed_log_probs(logits, SamplingConfig(top_p=0.01))
    assert got[0, 0] == 0.0 and (got[0, 1:] == -math.inf).all()


def test_sampled_token_log_probs_gathers_each_token():
    torch.manual_seed(1)
    logits = torch.randn(2, 5, 11)
    tokens = torch.randint(0, 11, (2, 5))
    sampling = SamplingConfig(temperature=0.5)
    full = processed_log_probs(logits, sampling)
    got = sampled_token_log_probs(logits, tokens, sampling)
    for b in range(2):
        for t in range(5):
            assert got[b, t] == full[b, t, tokens[b, t]]
