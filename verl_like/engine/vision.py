"""The training side of vision-language models: which HF class loads them, the frozen tower, the masked placeholder.

A model whose config has a `vision_config` (Idefics3 / SmolVLM) is loaded with `AutoModelForImageTextToText`.
Its batches carry `pixel_values` (rows, image slots, C, H, W) and `pixel_attention_mask` (rows, slots, H, W), made
once per prompt by the dataset (data/vision.py) and passed with each padded micro-batch; all-zero slots are padding
the model drops. `freeze_vision_tower` stops gradients into the vision encoder (the connector and the language
model still train). The image placeholder's logit is masked to a large negative value: the rollout never samples it
(rollout/vllm_vision.py), and both sides then normalise over the same vocabulary.

Supported: image-token families whose HF model takes (input_ids, pixel_values, pixel_attention_mask) — Idefics3 /
SmolVLM. Qwen2-VL / Qwen2.5-VL (M-RoPE position ids, image_grid_thw) are refused, as is packing image rows.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)

VISION_TENSOR_KEYS = ("pixel_values", "pixel_attention_mask")
SUPPORTED_VISION_MODEL_TYPES = ("idefics3", "smolvlm")
# Far below any real logit, finite so that softmax gives 0 and entropy's p * log p stays 0 (not nan), even after
# division by a temperature < 1.
MASKED_LOGIT = -1e30


def is_vision_config(hf_config: Any) -> bool:
    """True for a vision-language model's config (it has a vision tower)."""
    return getattr(hf_config, "vision_config", None) is not None


def check_supported(hf_config: Any) -> None:
    """Raises naming the model type for a vision-language family the engine does not train."""
    if hf_config.model_type not in SUPPORTED_VISION_MODEL_TYPES:
        raise ValueError(
            f"model_type={hf_config.model_type!r} is a vision-language model verl_like does not train yet; supported: "
            f"{SUPPORTED_VISION_MODEL_TYPES} (Qwen2-VL / Qwen2.5-VL need M-RoPE position ids and image_grid_thw, and "
            "their image processor imports torchvision, which does not load on CPU machines; docs/vision.md)"
        )


def vision_tower(model: torch.nn.Module) -> torch.nn.Module:
    """The vision encoder of an Idefics3-style model (`model.vision_model`)."""
    inner = getattr(model, "model", model)
    tower = getattr(inner, "vision_model", None)
    if tower is None:
        raise ValueError(f"{type(model).__name__} has no `model.vision_model`; cannot freeze its vision tower")
    return tower


def prepare_vision_model(model: torch.nn.Module, freeze_vision_tower: bool) -> None:
    """Freezes the tower when asked and masks the image placeholder's logit in every forward (in place)."""
    if freeze_vision_tower:
        tower = vision_tower(model)
        tower.requires_grad_(False)
        logger.info("vision tower frozen: %.2fM parameters", sum(p.numel() for p in tower.parameters()) / 1e6)
    # FSDP2 shards each `_no_split_modules` block; Idefics3 names its vision *attention*, whose output is a view
    # (FSDP2 warns that an in-place op on it would skip the backward all-gather). Its encoder layer is the block.
    units = list(getattr(model, "_no_split_modules", None) or [])
    model._no_split_modules = ["Idefics3EncoderLayer" if u == "Idefics3VisionAttention" else u for u in units]
    image_token_id = int(model.config.image_token_id)

    def mask_placeholder(_module, _inputs, logits: torch.Tensor) -> torch.Tensor:
        logits = logits.clone()
        logits[..., image_token_id] = MASKED_LOGIT
        return logits

    model.get_output_embeddings().register_forward_hook(mask_placeholder)


def frozen_parameter_names(model: torch.nn.Module) -> set[str]:
    """HF names of the parameters that never change (a frozen tower): the weight sync sends them once."""
    return {name for name, param in model.named_parameters() if not param.requires_grad}
