"""The training side of vision-language models: which HF class loads them, the frozen tower, the masked placeholder.

A model whose config has a `vision_config` (Idefics3 / SmolVLM) is loaded with `AutoModelForImageTextToText`.
Its batches carry `pixel_values` (rows, image slots, C, H, W) and `pixel_attention_mask` (rows, slots, H, W), made
once per prompt by the dataset (data/vision.py) and passed with each padded micro-batch; all-zero slots are padding
the model drops. `freeze_vision_tower` stops gradients into the vision encoder (the connector and the language
model still train; Qwen2-VL's connector is the tower's `merger`). The image placeholder's logit is masked to a
large negative value: the rollout never samples it (rollout/vllm_vision.py), and both sides then normalise over the
same vocabulary.

Supported families, by the inputs their HF model takes beside input_ids:
- Idefics3 / SmolVLM: `pixel_values` (rows, slots, C, H, W) and `pixel_attention_mask`, passed as they are.
- Qwen2-VL / Qwen2.5-VL (`MROPE_MODEL_TYPES`): the batch carries `pixel_values` (rows, patches, C*T*P*P) and
  `image_grid_thw` (rows, images, 3), each row zero-padded (a zero grid is no image), and `mrope_position_ids`
  (rows, 3, seq_len), the M-RoPE positions made once per prompt by the dataset (data/mrope.py). `model_inputs` turns
  a micro-batch's rows into the model's flat form: the rows' patches concatenated in row order, their grids, and
  the positions as (3, rows, seq_len). `image_feature_check` compares each row's placeholder count with the image
  features its grids give before any forward, naming the row.
Packing image rows is refused (config/vision.py).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from verl_like.data.mrope import MROPE_MODEL_TYPES, MROPE_POSITIONS

logger = logging.getLogger(__name__)

# Every per-row tensor an image batch may carry to the model; each family uses some of them.
VISION_TENSOR_KEYS = ("pixel_values", "pixel_attention_mask", "image_grid_thw", MROPE_POSITIONS)
SUPPORTED_VISION_MODEL_TYPES = ("idefics3", "smolvlm", *MROPE_MODEL_TYPES)
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
            f"{SUPPORTED_VISION_MODEL_TYPES} (docs/vision.md)"
        )


def vision_tower(model: torch.nn.Module) -> torch.nn.Module:
    """The vision encoder: `model.vision_model` (Idefics3) or `model.visual` (Qwen2-VL, its merger included)."""
    inner = getattr(model, "model", model)
    tower = getattr(inner, "vision_model", None) or getattr(inner, "visual", None)
    if tower is None:
        raise ValueError(f"{type(model).__name__} has no `model.vision_model` or `model.visual`; cannot freeze its "
                         "vision tower")
    return tower


def prepare_vision_model(model: torch.nn.Module, freeze_vision_tower: bool) -> None:
    """Freezes the tower when asked and masks the image placeholder's logit in every forward (in place)."""
    if freeze_vision_tower:
        tower = vision_tower(model)
        tower.requires_grad_(False)
        merger = getattr(tower, "merger", None)  # Qwen2-VL's connector lives in its tower; it keeps training
        if merger is not None:
            merger.requires_grad_(True)
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


def rows_with_images(tensors: Any) -> torch.Tensor | None:
    """`(rows,)` bool: the rows that hold an image; None for a batch without image inputs."""
    if "image_grid_thw" in tensors.keys():
        return tensors["image_grid_thw"].prod(dim=-1).sum(dim=-1) > 0
    if "pixel_attention_mask" in tensors.keys():
        return tensors["pixel_attention_mask"].flatten(1).any(dim=1)
    return None


def model_inputs(tensors: Any) -> dict[str, torch.Tensor]:
    """The image inputs of a padded micro-batch as the model's forward takes them ({} for a text batch); for the
    M-RoPE families also `position_ids` (3, rows, seq_len), which replace the batch's text positions."""
    if "image_grid_thw" not in tensors.keys():
        return {key: tensors[key] for key in ("pixel_values", "pixel_attention_mask") if key in tensors.keys()}
    grid, pixels = tensors["image_grid_thw"], tensors["pixel_values"]
    patches = grid.prod(dim=-1)  # (rows, images): 0 for an empty image slot
    per_row = patches.sum(dim=-1).tolist()
    inputs = {"position_ids": tensors[MROPE_POSITIONS].transpose(0, 1)}
    if sum(per_row):
        # Row order, then image order within a row: the order of the placeholders the model fills.
        inputs["pixel_values"] = torch.cat([pixels[row, :count] for row, count in enumerate(per_row)])
        inputs["image_grid_thw"] = grid[patches > 0]
    return inputs


def image_feature_check(hf_config: Any):
    """A check of a batch's rows for the M-RoPE families (None for others): raises ValueError naming the first row
    whose `<|image_pad|>` count differs from the image features its `image_grid_thw` gives (patches / merge^2)."""
    if getattr(hf_config, "model_type", None) not in MROPE_MODEL_TYPES:
        return None
    image_token_id = int(hf_config.image_token_id)
    merge = int(hf_config.vision_config.spatial_merge_size) ** 2

    def check(tensors: Any) -> None:
        if "image_grid_thw" not in tensors.keys():
            return
        placeholders = ((tensors["input_ids"] == image_token_id) & tensors["attention_mask"].bool()).sum(dim=-1)
        patches = tensors["image_grid_thw"].prod(dim=-1).sum(dim=-1)
        if int(patches.max()) > tensors["pixel_values"].shape[1]:
            row = int(patches.argmax())
            raise ValueError(f"row {row} of this rank's batch: its image_grid_thw gives {int(patches[row])} patches but "
                             f"pixel_values holds {tensors['pixel_values'].shape[1]} per row")
        features = patches // merge
        bad = torch.nonzero(placeholders != features).flatten().tolist()
        if bad:
            row = bad[0]
            raise ValueError(
                f"row {row} of this rank's batch holds {int(placeholders[row])} image placeholder tokens but its "
                f"image_grid_thw {tensors['image_grid_thw'][row].tolist()} gives {int(features[row])} image features "
                f"({len(bad)} such rows); the prompt was cut or a placeholder was sampled, or the pixels belong to "
                "another prompt"
            )

    return check
