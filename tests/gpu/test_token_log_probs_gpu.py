"""The fused Triton log-prob/entropy kernels (what the engines run on CUDA) against a float64 reference: values and
gradients on Qwen2.5's 151,936-word vocabulary in bf16 and float32, strided (padded-path) logits, no entropy."""

from __future__ import annotations

import pytest
import torch

from verl_like.engine import token_log_probs as module


def _float64_reference(logits, labels, temperature, grad_lp, grad_ent):
    leaf = logits.detach().double().requires_grad_()
    scaled = leaf / temperature
    log_p = torch.log_softmax(scaled, dim=-1)
    log_probs = log_p.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_p.exp() * log_p).sum(-1) if grad_ent is not None else None
    loss = (log_probs * grad_lp.double()).sum()
    if grad_ent is not None:
        loss = loss + (entropy * grad_ent.double()).sum()
    loss.backward()
    return log_probs.detach(), (entropy.detach() if entropy is not None else None), leaf.grad


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("calculate_entropy", [True, False])
@pytest.mark.parametrize("strided", [False, True])
def test_fused_kernels_match_float64_on_a_full_vocabulary(dtype, calculate_entropy, strided):
    assert module.fused_log_probs_enabled(), "Triton should be importable next to a CUDA torch"
    torch.manual_seed(0)
    rows, vocab, temperature = 96, 151_936, 0.7
    if strided:  # the padded path hands in logits[:, :-1] of (batch, response_len + 1, vocab)
        logits = (torch.randn(3, rows // 3 + 1, vocab, device="cuda") * 4).to(dtype)[:, :-1]
    else:
        logits = (torch.randn(rows, vocab, device="cuda") * 4).to(dtype)
    labels = torch.randint(0, vocab, logits.shape[:-1], device="cuda")
    leaf = logits.detach().requires_grad_()
    log_probs, entropy = module.token_log_probs(leaf, labels, temperature, calculate_entropy)
    assert log_probs.dtype == torch.float32 and log_probs.shape == labels.shape
    assert (entropy is not None) == calculate_entropy
    grad_lp = torch.randn_like(log_probs)
    grad_ent = torch.randn_like(log_probs) if calculate_entropy else None
    loss = (log_probs * grad_lp).sum() + ((entropy * grad_ent).sum() if calculate_entropy else 0)
    loss.backward()
    assert leaf.grad.dtype == dtype and leaf.grad.shape == logits.shape

    ref_lp, ref_ent, ref_grad = _float64_reference(logits, labels, temperature, grad_lp, grad_ent)
    torch.testing.assert_close(log_probs.double(), ref_lp, atol=2e-5, rtol=1e-5)
    if calculate_entropy:
        torch.testing.assert_close(entropy.double(), ref_ent, atol=2e-4, rtol=1e-5)
    # the gradient is rounded to the logits' dtype once, as the reference's cast back does
    tolerance = 1e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(leaf.grad.double(), ref_grad, atol=tolerance * ref_grad.abs().max().item(), rtol=0)


def test_fused_kernels_agree_with_the_torch_path_in_the_same_dtype():
    torch.manual_seed(1)
    logits = (torch.randn(64, 151_936, device="cuda") * 3).to(torch.bfloat16)
    labels = torch.randint(0, 151_936, (64,), device="cuda")
    fused_lp, fused_ent = module.token_log_probs(logits, labels, 1.0, True)
    ref_lp, ref_ent = module.reference_token_log_probs(logits, labels, 1.0, True)
    torch.testing.assert_close(fused_lp, ref_lp, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(fused_ent, ref_ent, atol=1e-3, rtol=1e-5)


def test_a_label_outside_the_vocabulary_is_refused():
    logits = torch.zeros(4, 1000, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="label 1000 is outside the vocabulary"):
        module.token_log_probs(logits, torch.tensor([0, 1, 1000, 2], device="cuda"), 1.0, False)
