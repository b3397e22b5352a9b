"""engine/lora.py on a plain (unsharded) PEFT model, against PEFT's own merge: the merged policy, the base weights
under HF names, the adapter under PEFT's saved names, and the adapter switched off."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

pytest.importorskip("peft")

from verl_like.engine import lora  # noqa: E402
from verl_like.engine.config import LoraSettings  # noqa: E402
from verl_like.models.tiny import build_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("lora_unit") / "tiny"))


def trained_peft(model_dir: str, **settings):
    model = lora.apply_lora(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                            LoraSettings(**{"rank": 4, "alpha": 8, **settings}))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if lora.is_adapter_param(name):  # as if trained: B is no longer zero
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    return model


def test_merged_state_equals_peft_merge_and_unload(model_dir):
    model = trained_peft(model_dir)
    merged = dict(lora.merged_state_iterator(model))
    reference = {n: p.detach().clone() for n, p in trained_peft(model_dir).merge_and_unload().named_parameters()}
    assert merged.keys() == reference.keys()
    for name, tensor in reference.items():
        torch.testing.assert_close(merged[name], tensor, rtol=0, atol=1e-6)


def test_base_state_has_hf_names_and_the_untouched_base_weights(model_dir):
    base = dict(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).named_parameters())
    state = dict(lora.base_state_iterator(trained_peft(model_dir)))
    assert state.keys() == base.keys()
    assert all(torch.equal(state[name], base[name]) for name in base)


def test_adapter_state_uses_peft_saved_names_and_is_a_copy(model_dir):
    from peft.utils import get_peft_model_state_dict

    model = trained_peft(model_dir, target_modules=("q_proj", "v_proj"))
    state = lora.adapter_state(model)
    saved = get_peft_model_state_dict(model)
    assert state.keys() == saved.keys() and len(state) == 2 * 2 * 2  # 2 layers x (q, v) x (A, B)
    for tensor in state.values():
        tensor.mul_(2)  # the caller (vLLM) may scale in place
    assert all(torch.equal(lora.adapter_state(model)[name], saved[name]) for name in saved)


def test_exclude_modules_keeps_them_out_of_the_adapter(model_dir):
    model = trained_peft(model_dir, exclude_modules=("o_proj", "down_proj"))
    names = lora.adapter_state(model)
    assert names and not any("o_proj" in n or "down_proj" in n for n in names)


def test_adapter_disabled_forward_is_the_base_models(model_dir):
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)(input_ids=ids).logits
    model = trained_peft(model_dir)
    with lora.adapter_disabled(model):
        disabled = model(input_ids=ids).logits
    assert torch.equal(disabled, base)
    assert not torch.allclose(model(input_ids=ids).logits, base)


def test_dropout_in_a_loaded_adapter_is_refused(model_dir, tmp_path):
    from peft import LoraConfig, get_peft_model

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1)).save_pretrained(tmp_path / "adapter")
    with pytest.raises(ValueError, match="lora_dropout=0.1"):
        lora.apply_lora(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                        LoraSettings(rank=4, adapter_path=str(tmp_path / "adapter")))


def test_lora_adapter_path_starts_from_the_saved_adapter_trainable(model_dir, tmp_path):
    trained_peft(model_dir).save_pretrained(tmp_path / "adapter")
    saved = lora.adapter_state(trained_peft(model_dir))
    model = lora.apply_lora(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                            LoraSettings(rank=4, adapter_path=str(tmp_path / "adapter")))
    loaded = lora.adapter_state(model)
    assert loaded.keys() == saved.keys() and all(torch.equal(loaded[n], saved[n]) for n in saved)
    assert all(p.requires_grad == lora.is_adapter_param(n) for n, p in model.named_parameters())
