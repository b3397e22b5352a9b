"""The chunked LM head (engine/head_log_probs.py) against a float64 softmax of the whole logits: values and both
gradients, over several chunks, with and without entropy; the switch."""

from __future__ import annotations

import pytest
import torch

from verl_like.engine import head_log_probs
from verl_like.engine.head_log_probs import chunk_rows, chunked_head_enabled, head_token_log_probs

TOKENS, HIDDEN, VOCAB = 11, 6, 37


def _inputs(seed: int):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(TOKENS, HIDDEN, generator=generator)
    weight = torch.randn(VOCAB, HIDDEN, generator=generator)
    labels = torch.randint(0, VOCAB, (TOKENS,), generator=generator)
    return hidden, weight, labels


def _reference(hidden, weight, labels, temperature):
    """float64 log p(label) and entropy with autograd through the whole logits."""
    logits = hidden.double() @ weight.double().T / temperature
    log_softmax = torch.log_softmax(logits, dim=-1)
    log_probs = log_softmax.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    return log_probs, entropy


@pytest.mark.parametrize("chunk", [1, 4, TOKENS, 64])
@pytest.mark.parametrize("with_entropy", [True, False])
def test_values_and_gradients_match_a_float64_softmax(chunk, with_entropy):
    hidden, weight, labels = _inputs(chunk)
    temperature = 0.7
    grad_lp = torch.randn(TOKENS, dtype=torch.float64)
    grad_ent = torch.randn(TOKENS, dtype=torch.float64)

    h64 = hidden.double().requires_grad_()
    w64 = weight.double().requires_grad_()
    ref_lp, ref_ent = _reference(h64, w64, labels, temperature)
    ref_loss = (ref_lp * grad_lp).sum() + ((ref_ent * grad_ent).sum() if with_entropy else 0.0)
    ref_loss.backward()

    h = hidden.clone().requires_grad_()
    w = weight.clone().requires_grad_()
    log_probs, entropy = head_token_log_probs(h, w, labels, temperature, with_entropy, chunk=chunk)
    assert log_probs.dtype == entropy.dtype == torch.float32
    loss = (log_probs * grad_lp.float()).sum() + ((entropy * grad_ent.float()).sum() if with_entropy else 0.0)
    loss.backward()

    torch.testing.assert_close(log_probs.double(), ref_lp.detach(), atol=1e-5, rtol=1e-5)
    if with_entropy:
        torch.testing.assert_close(entropy.double(), ref_ent.detach(), atol=1e-5, rtol=1e-5)
    else:
        assert torch.count_nonzero(entropy) == 0
    # float32 sums of ~40 terms of size ~1 (the softmax-weighted (z - lse + H) of the entropy's gradient)
    torch.testing.assert_close(h.grad.double(), h64.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(w.grad.double(), w64.grad, atol=1e-4, rtol=1e-4)


def test_entropy_alone_backpropagates():
    hidden, weight, labels = _inputs(3)
    h64 = hidden.double().requires_grad_()
    _, ref_ent = _reference(h64, weight.double(), labels, 1.0)
    ref_ent.sum().backward()
    h = hidden.clone().requires_grad_()
    _, entropy = head_token_log_probs(h, weight, labels, 1.0, True, chunk=5)
    entropy.sum().backward()
    torch.testing.assert_close(h.grad.double(), h64.grad, atol=1e-4, rtol=1e-4)


def test_bfloat16_stays_close_to_float64():
    hidden, weight, labels = _inputs(4)
    log_probs, entropy = head_token_log_probs(hidden.bfloat16(), weight.bfloat16(), labels, 1.0, True, chunk=3)
    ref_lp, ref_ent = _reference(hidden.bfloat16().double(), weight.bfloat16().double(), labels, 1.0)
    # the bf16 matmul rounds each logit (|z| up to ~10 here: an absolute error of ~0.05 at most)
    torch.testing.assert_close(log_probs.double(), ref_lp, atol=0.1, rtol=0.02)
    torch.testing.assert_close(entropy.double(), ref_ent, atol=0.1, rtol=0.02)


def test_shapes_are_checked():
    hidden, weight, labels = _inputs(5)
    with pytest.raises(ValueError, match=r"must be \(tokens, hidden\)"):
        head_token_log_probs(hidden.unsqueeze(0), weight, labels, 1.0, False)
    with pytest.raises(ValueError, match="labels"):
        head_token_log_probs(hidden, weight, labels[:-1], 1.0, False)


def test_chunk_rows_bounds_one_chunk_of_logits():
    rows = chunk_rows(151936, 2)
    assert rows * 151936 * 2 <= head_log_probs.CHUNK_BYTES < (rows + 1) * 151936 * 2
    assert chunk_rows(10**9, 4) == 256


def test_the_switch_defaults_to_cuda_only(monkeypatch):
    monkeypatch.delenv("VERL_LIKE_CHUNKED_HEAD", raising=False)
    assert not chunked_head_enabled(torch.device("cpu"))
    monkeypatch.setenv("VERL_LIKE_CHUNKED_HEAD", "1")
    assert chunked_head_enabled(torch.device("cpu"))
    monkeypatch.setenv("VERL_LIKE_CHUNKED_HEAD", "0")
    assert not chunked_head_enabled(torch.device("cuda"))
    monkeypatch.setenv("VERL_LIKE_CHUNKED_HEAD", "yes")
    with pytest.raises(ValueError, match="VERL_LIKE_CHUNKED_HEAD='yes'"):
        chunked_head_enabled(torch.device("cpu"))
