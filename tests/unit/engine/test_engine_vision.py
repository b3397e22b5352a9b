"""engine/vision.py on the tiny Idefics3: the class it loads, the frozen tower, the masked placeholder logit."""

import pytest
import torch

from verl_like.engine.config import EngineConfig
from verl_like.engine.model_loading import load_model
from verl_like.data.mrope import continue_positions
from verl_like.engine.vision import MASKED_LOGIT, check_supported, model_inputs, rows_with_images
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


def test_qwen2_vl_families_are_accepted_and_other_vision_families_refused_naming_the_type():
    class Config:
        model_type = "qwen2_vl"

    for model_type in ("qwen2_vl", "qwen2_5_vl", "idefics3"):
        Config.model_type = model_type
        check_supported(Config())
    Config.model_type = "llava"
    with pytest.raises(ValueError, match="model_type='llava' is a vision-language model verl_like does not train"):
        check_supported(Config())


def test_model_inputs_concatenate_each_rows_patches_in_row_order_and_transpose_the_positions():
    grids = torch.tensor([[[1, 2, 2], [0, 0, 0]], [[1, 2, 4], [1, 2, 2]]])
    pixels = torch.arange(2 * 12 * 3, dtype=torch.float32).view(2, 12, 3)
    positions = torch.arange(2 * 3 * 5).view(2, 3, 5)
    inputs = model_inputs({"image_grid_thw": grids, "pixel_values": pixels, "mrope_position_ids": positions})
    assert torch.equal(inputs["pixel_values"], torch.cat([pixels[0, :4], pixels[1, :12]]))
    assert inputs["image_grid_thw"].tolist() == [[1, 2, 2], [1, 2, 4], [1, 2, 2]]
    assert torch.equal(inputs["position_ids"], positions.transpose(0, 1))
    assert rows_with_images({"image_grid_thw": grids}).tolist() == [True, True]


def test_response_positions_count_on_from_the_prompts_largest_position():
    prompt = torch.tensor([[[0, 0, 1, 2, 2, 4], [0, 0, 1, 2, 3, 4], [0, 0, 1, 2, 3, 4]]])  # an image, then text
    assert continue_positions(prompt, 3)[0, :, 6:].tolist() == [[5, 6, 7]] * 3


def test_a_frozen_qwen2_vl_tower_keeps_its_merger_training(tmp_path):
    from verl_like.models.tiny_qwen_vl import TinyQwenVLSpec, build_tiny_qwen_vl

    path = build_tiny_qwen_vl(tmp_path / "qwen2_vl", TinyQwenVLSpec(model_type="qwen2_vl"))
    model = load_model(EngineConfig(model_path=str(path), freeze_vision_tower=True))
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    assert frozen and all(".visual." in name and ".merger." not in name for name in frozen)
    assert any(".visual.merger." in name for name, p in model.named_parameters() if p.requires_grad)
