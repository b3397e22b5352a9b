"""engine/vision.py on the tiny Idefics3: the class it loads, the frozen tower, the masked placeholder logit."""

import pytest
import torch

from verl_like.engine.config import EngineConfig
from verl_like.engine.model_loading import load_model
from verl_like.engine.vision import MASKED_LOGIT, check_supported
from verl_like.models.tiny_vlm import build_tiny_vlm


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    return build_tiny_vlm(tmp_path_factory.mktemp("engine_vlm") / "tiny_vlm")


def test_freeze_vision_tower_freezes_the_tower_only_and_the_placeholder_is_masked(vlm_dir):
    model = load_model(EngineConfig(model_path=str(vlm_dir), freeze_vision_tower=True))
    assert type(model).__name__ == "Idefics3ForConditionalGeneration"
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    assert frozen and all(".vision_model." in name for name in frozen)
    assert all(p.requires_grad for name, p in model.named_parameters() if "connector" in name or "text_model" in name)
    assert "Idefics3EncoderLayer" in model._no_split_modules  # FSDP2's vision unit
    ids = torch.tensor([[1, 5, 24, 31]])
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    assert torch.all(logits[..., model.config.image_token_id] == MASKED_LOGIT)
    assert torch.isfinite(torch.log_softmax(logits / 0.7, -1)).all()
    unfrozen = load_model(EngineConfig(model_path=str(vlm_dir)))
    assert all(p.requires_grad for p in unfrozen.parameters())


def test_qwen2_vl_is_refused_with_the_reason():
    class Config:
        model_type = "qwen2_vl"

    with pytest.raises(ValueError, match="M-RoPE"):
        check_supported(Config())
