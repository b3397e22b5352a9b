"""One micro-batch through a plain (unsharded) model: packed equals padded, both equal a float64 per-sequence loop."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from engine_reference import TEMPERATURE, make_batch, reference_outputs
from verl_like.engine.config import EngineConfig
from verl_like.engine.model_loading import load_model, pick_attn_implementation
from verl_like.engine.model_outputs import micro_batch_outputs, pack

OUTPUT_KEYS = {"causal_lm": ("log_probs", "entropy"), "value": ("values",), "sequence_classifier": ("scores",)}


@pytest.fixture(scope="module")
def tensors(vocab_size):
    batch = make_batch(6, vocab_size, seed=5)
    return TensorDict(batch, batch_size=[6])


@pytest.fixture(scope="module")
def models(tiny_model_dir):
    cache = {}

    def get(kind: str, attn: str | None = None):
        if (kind, attn) not in cache:
            config = EngineConfig(model_path=tiny_model_dir, model_kind=kind, attn_implementation=attn,
                                  use_remove_padding=attn == "varlen")
            cache[(kind, attn)] = load_model(config)
        return cache[(kind, attn)]

    return get


@pytest.mark.parametrize("kind", ["causal_lm", "value", "sequence_classifier"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_and_padded_match_the_float64_reference(models, tensors, kind, attn):
    model = models(kind, attn)
    assert model.config._attn_implementation == attn
    with torch.no_grad():
        reference = reference_outputs(model.double(), kind, dict(tensors.items()), TEMPERATURE)
        model.float()
        padded = micro_batch_outputs(model, kind, tensors, packed=False, temperature=TEMPERATURE,
                                     calculate_entropy=True)
        packed = micro_batch_outputs(model, kind, tensors, packed=True, temperature=TEMPERATURE,
                                     calculate_entropy=True)
    assert set(padded) == set(packed) == set(OUTPUT_KEYS[kind])
    for key in OUTPUT_KEYS[kind]:
        torch.testing.assert_close(padded[key], reference[key].float(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(packed[key], padded[key], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["causal_lm", "value"])
def test_varlen_attention_on_packed_rows_matches_the_float64_reference(models, tensors, kind):
    """attn_implementation="varlen" (torch's varlen FlashAttention on CUDA; one sdpa call per sequence here)."""
    model = models(kind, "varlen")
    assert model.config._attn_implementation == "verl_like_varlen"
    with torch.no_grad():
        reference = reference_outputs(model.double(), kind, dict(tensors.items()), TEMPERATURE)
        model.float()
        packed = micro_batch_outputs(model, kind, tensors, packed=True, temperature=TEMPERATURE,
                                     calculate_entropy=True)
        for key in OUTPUT_KEYS[kind]:
            torch.testing.assert_close(packed[key], reference[key].float(), atol=1e-5, rtol=1e-5)
        with pytest.raises(ValueError, match="varlen' takes packed rows only"):
            micro_batch_outputs(model, kind, tensors, packed=False, temperature=TEMPERATURE)


def test_varlen_attention_needs_packed_sequences():
    with pytest.raises(ValueError, match="use_remove_padding=True"):
        EngineConfig(model_path="x", attn_implementation="varlen", use_remove_padding=False)


def test_log_probs_are_zero_outside_the_response_mask_and_finite_everywhere(models, tensors):
    with torch.no_grad():
        outputs = micro_batch_outputs(models("causal_lm"), "causal_lm", tensors, packed=False, calculate_entropy=True)
    outside = ~tensors["response_mask"].bool()
    assert outside.any()
    for value in outputs.values():
        assert torch.isfinite(value).all()
        assert (value[outside] == 0).all()


def test_temperature_changes_log_probs_as_the_rollout_does(models, tensors):
    model = models("causal_lm")
    with torch.no_grad():
        hot = micro_batch_outputs(model, "causal_lm", tensors, packed=True, temperature=2.0)["log_probs"]
        cold = micro_batch_outputs(model, "causal_lm", tensors, packed=True, temperature=0.5)["log_probs"]
    mask = tensors["response_mask"].bool()
    assert not torch.allclose(hot[mask], cold[mask])


def test_gradients_flow_through_packed_outputs(models, tensors):
    model = models("causal_lm")
    model.zero_grad(set_to_none=True)
    outputs = micro_batch_outputs(model, "causal_lm", tensors, packed=True, calculate_entropy=True)
    (outputs["log_probs"].sum() + outputs["entropy"].sum()).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    model.zero_grad(set_to_none=True)


def test_pack_lays_out_valid_tokens_back_to_back(tensors):
    layout = pack(tensors)
    mask = tensors["attention_mask"].bool()
    assert layout.input_ids.shape == (1, int(mask.sum()))
    assert torch.equal(layout.input_ids[0], tensors["input_ids"][mask])
    lengths = mask.sum(dim=1)
    assert torch.equal(layout.last_index, torch.cumsum(lengths, 0) - 1)
    assert (layout.position_ids[0, layout.last_index - lengths + 1] == 0).all()


def test_pack_rejects_position_ids_that_do_not_restart_per_sequence(tensors):
    bad = tensors.clone()
    bad["position_ids"] = bad["position_ids"] + 1
    with pytest.raises(ValueError, match="count 0, 1, 2"):
        pack(bad)


def test_pack_rejects_an_empty_sequence(tensors):
    bad = tensors.clone()
    bad["attention_mask"] = bad["attention_mask"].clone()
    bad["attention_mask"][0] = 0
    with pytest.raises(ValueError, match="no valid token"):
        pack(bad)


def test_response_mask_beyond_the_attention_mask_is_rejected_when_packed(models, tensors):
    bad = tensors.clone()
    bad["response_mask"] = torch.ones_like(bad["response_mask"])
    with pytest.raises(ValueError, match="masks disagree"):
        micro_batch_outputs(models("causal_lm"), "causal_lm", bad, packed=True)


def test_attention_defaults_to_sdpa_without_flash_attn():
    assert pick_attn_implementation("eager") == "eager"
    expected = "flash_attention_2" if _has_flash_attn() else "sdpa"
    assert pick_attn_implementation(None) == expected
    assert pick_attn_implementation(None, packed=True) == expected  # no CUDA here: no varlen kernel


def _has_flash_attn() -> bool:
    import importlib.util

    return importlib.util.find_spec("flash_attn") is not None


def test_topk_log_probs_at_given_ids_match_a_float64_loop_padded_and_packed(models, tensors, vocab_size):
    """With "teacher_topk_ids" in the batch, the causal LM also returns its log-probs of those tokens."""
    from engine_reference import PROMPT_LEN, RESPONSE_LEN

    generator = torch.Generator().manual_seed(11)
    rows, k = tensors.batch_size[0], 4
    with_ids = tensors.clone()
    with_ids["teacher_topk_ids"] = torch.randint(0, vocab_size, (rows, RESPONSE_LEN, k), generator=generator)
    model = models("causal_lm", "sdpa")
    expected = torch.zeros(rows, RESPONSE_LEN, k, dtype=torch.float64)
    with torch.no_grad():
        double = model.double()
        for row in range(rows):
            valid = with_ids["attention_mask"][row].bool()
            ids = with_ids["input_ids"][row][valid]
            prompt_valid = int(valid[:PROMPT_LEN].sum())
            log_probs = torch.log_softmax(double(input_ids=ids[None]).logits[0] / TEMPERATURE, dim=-1)
            for t in range(len(ids) - prompt_valid):
                expected[row, t] = log_probs[prompt_valid - 1 + t, with_ids["teacher_topk_ids"][row, t]]
        model.float()
        padded = micro_batch_outputs(model, "causal_lm", with_ids, packed=False, temperature=TEMPERATURE)
        packed = micro_batch_outputs(model, "causal_lm", with_ids, packed=True, temperature=TEMPERATURE)
    torch.testing.assert_close(padded["topk_log_probs"], expected.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed["topk_log_probs"], padded["topk_log_probs"], atol=1e-5, rtol=1e-5)


def _loss_gradients(model, tensors, monkeypatch, chunked: str) -> tuple[dict, dict]:
    """Outputs and parameter gradients of log p + entropy (packed), the head chunked or plain."""
    monkeypatch.setenv("VERL_LIKE_CHUNKED_HEAD", chunked)
    model.zero_grad(set_to_none=True)
    outputs = micro_batch_outputs(model, "causal_lm", tensors, packed=True, temperature=TEMPERATURE,
                                  calculate_entropy=True)
    (outputs["log_probs"].sum() + 0.5 * outputs["entropy"].sum()).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return {key: value.detach() for key, value in outputs.items()}, grads


@pytest.mark.parametrize("tied", [False, True])
def test_chunked_head_matches_the_float64_reference_and_the_plain_gradients(tiny_model_dir, tied_model_dir,
                                                                          tensors, monkeypatch, tied):
    """VERL_LIKE_CHUNKED_HEAD=1 on CPU: the packed path's log-probs from the hidden states, 3 tokens a chunk."""
    from verl_like.engine import head_log_probs

    model = load_model(EngineConfig(model_path=tied_model_dir if tied else tiny_model_dir))
    assert model.config.tie_word_embeddings is tied
    with torch.no_grad():
        reference = reference_outputs(model.double(), "causal_lm", dict(tensors.items()), TEMPERATURE)
    model.float()
    monkeypatch.setattr(head_log_probs, "chunk_rows", lambda vocab, itemsize: 3)
    calls = []
    original = head_log_probs.head_token_log_probs
    monkeypatch.setattr(head_log_probs, "head_token_log_probs", lambda *a, **k: calls.append(1) or original(*a, **k))
    chunked, chunked_grads = _loss_gradients(model, tensors, monkeypatch, "1")
    assert calls, "the chunked head was not used"
    plain, plain_grads = _loss_gradients(model, tensors, monkeypatch, "0")
    assert len(calls) == 1
    for key in ("log_probs", "entropy"):
        torch.testing.assert_close(chunked[key], reference[key].float(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(chunked[key], plain[key], atol=1e-5, rtol=1e-5)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(chunked_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_a_model_that_transforms_its_head_output_keeps_the_plain_head(tiny_model_dir, tensors, monkeypatch):
    """A forward that soft-caps the head's output (as Gemma 2 does) is caught on its first micro-batch: the
    log-probs still equal the plain path's, and the model stays on the plain head afterwards."""
    from verl_like.engine import head_log_probs

    model = load_model(EngineConfig(model_path=tiny_model_dir))
    cap = 3.0
    handle = model.register_forward_hook(lambda _m, _i, out: setattr(out, "logits", cap * torch.tanh(out.logits / cap)))
    try:
        monkeypatch.setenv("VERL_LIKE_CHUNKED_HEAD", "0")
        with torch.no_grad():
            plain = micro_batch_outputs(model, "causal_lm", tensors, packed=True, calculate_entropy=True)
        monkeypatch.setenv("VERL_LIKE_CHUNKED_HEAD", "1")
        assert head_log_probs.plain_output_head(model) is not None
        with torch.no_grad():
            first = micro_batch_outputs(model, "causal_lm", tensors, packed=True, calculate_entropy=True)
        assert head_log_probs.plain_output_head(model) is None
    finally:
        handle.remove()
    for key in ("log_probs", "entropy"):
        torch.testing.assert_close(first[key], plain[key])
