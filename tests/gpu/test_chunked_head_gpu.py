"""The chunked LM head on CUDA (engine/head_log_probs.py with the Triton log-prob kernels) at Qwen's vocabulary:
the same log-probs, entropy and gradients as the whole bf16 logits through the fused kernels, in a fraction of the
memory; and through a real Qwen2 model's packed micro-batch."""

from __future__ import annotations

import pytest
import torch

VOCAB, HIDDEN = 151936, 896


def _inputs(tokens: int):
    generator = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(tokens, HIDDEN, device="cuda", generator=generator).bfloat16()
    weight = (torch.randn(VOCAB, HIDDEN, device="cuda", generator=generator) * 0.05).bfloat16()
    labels = torch.randint(0, VOCAB, (tokens,), device="cuda", generator=generator)
    return hidden, weight, labels


def _run(fn, hidden, weight, labels):
    """(log_probs, entropy, grad of hidden, grad of weight, peak bytes above the inputs) of one forward/backward."""
    h = hidden.clone().requires_grad_()
    w = weight.clone().requires_grad_()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    log_probs, entropy = fn(h, w, labels)
    (log_probs.sum() - 0.3 * entropy.sum()).backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    return log_probs.detach(), entropy.detach(), h.grad, w.grad, peak


def test_chunked_head_equals_whole_logits_through_the_fused_kernels_in_less_memory():
    from verl_like.engine.head_log_probs import chunk_rows, head_token_log_probs
    from verl_like.engine.token_log_probs import fused_log_probs_enabled, token_log_probs

    assert fused_log_probs_enabled()
    tokens = 3 * chunk_rows(VOCAB, 2) + 77  # four chunks, the last one short
    hidden, weight, labels = _inputs(tokens)
    whole = _run(lambda h, w, y: token_log_probs(h @ w.T, y, 0.9, True), hidden, weight, labels)
    chunked = _run(lambda h, w, y: head_token_log_probs(h, w, y, 0.9, True), hidden, weight, labels)
    for name, a, b in zip(("log_probs", "entropy"), chunked[:2], whole[:2]):
        torch.testing.assert_close(a, b, atol=1e-3, rtol=1e-3, msg=name)
    # bf16 gradients: the chunked weight gradient sums its chunks in float32, the whole-logits one inside one matmul
    for name, a, b in zip(("hidden", "weight"), chunked[2:4], whole[2:4]):
        error = (a.float() - b.float()).norm() / b.float().norm()
        assert error < 1e-2, (name, float(error))
    print(f"{tokens} tokens: peak {chunked[4] / 2**30:.2f} GiB chunked, {whole[4] / 2**30:.2f} GiB whole")
    assert chunked[4] < whole[4] / 2


def test_a_packed_qwen2_micro_batch_takes_the_chunked_head_on_cuda(small_bf16_qwen2, monkeypatch):
    from tensordict import TensorDict

    from verl_like.engine import head_log_probs
    from verl_like.engine.config import EngineConfig
    from verl_like.engine.model_loading import load_model
    from verl_like.engine.model_outputs import micro_batch_outputs

    model_dir, config = small_bf16_qwen2
    model = load_model(EngineConfig(model_path=model_dir, dtype="bfloat16", use_remove_padding=True,
                                    attn_implementation="varlen")).cuda()
    rows, prompt, response = 6, 40, 60
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, config.vocab_size, (rows, prompt + response), generator=generator)
    mask = torch.ones_like(ids)
    mask[0, :7] = 0  # left padding in one prompt
    mask[1, prompt + 50:] = 0  # a short response
    tensors = TensorDict({"input_ids": ids, "attention_mask": mask,
                          "position_ids": (mask.cumsum(1) - 1).clamp(min=0), "responses": ids[:, prompt:],
                          "response_mask": mask[:, prompt:]}, batch_size=[rows]).cuda()
    calls = []
    original = head_log_probs.head_token_log_probs
    monkeypatch.setattr(head_log_probs, "head_token_log_probs", lambda *a, **k: calls.append(1) or original(*a, **k))
    results = {}
    for mode in ("auto", "0"):
        monkeypatch.setenv("VERL_LIKE_CHUNKED_HEAD", mode)
        model.zero_grad(set_to_none=True)
        outputs = micro_batch_outputs(model, "causal_lm", tensors, packed=True, temperature=1.0,
                                      calculate_entropy=True)
        (outputs["log_probs"].sum() + outputs["entropy"].sum()).backward()
        results[mode] = (outputs, {n: p.grad.float() for n, p in model.named_parameters()})
    assert len(calls) == 1  # auto took it on CUDA, 0 did not
    for key in ("log_probs", "entropy"):
        torch.testing.assert_close(results["auto"][0][key], results["0"][0][key], atol=2e-2, rtol=2e-2)
    for name, grad in results["0"][1].items():
        error = (results["auto"][1][name] - grad).norm() / grad.norm().clamp(min=1e-12)
        assert error < 2e-2, (name, float(error))


@pytest.fixture(autouse=True)
def _free_memory():
    yield
    torch.cuda.empty_cache()
