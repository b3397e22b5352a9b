"""Image prompts for Qwen2-VL / Qwen2.5-VL: placeholders framed and expanded, patches and grids per row, M-RoPE.

What differs from Idefics3 (data/vision.py's VisionPrompts):
- The data's `<image>` (or image content part) becomes `<|vision_start|><|image_pad|><|vision_end|>`, Qwen's
  chat templates' form, before tokenizing; `raw_prompt_ids` hold one `<|image_pad|>` per image (what vLLM expands).
- An image of a given size expands to t*h*w / merge^2 `<|image_pad|>` tokens, its grid from the processor
  (`smart_resize` within min/max pixels); `image_slots` counts patches (t*h*w), not tiles.
- Pixels: `pixel_values` (rows, patches, C*T*P*P) with each row's patches first and zeros after, and
  `image_grid_thw` (rows, images, 3) with zero rows for absent images; both padded to the dataset's largest row,
  so the batches of one dataset concatenate.
- `mrope_position_ids` (rows, 3, prompt_len) are made with the batch (data/mrope.py) from the HF model's own rope
  index; the rollout continues them over the response.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from verl_like.data.mrope import MROPE_POSITIONS, MRopeIndex
from verl_like.data.vision import VisionPrompts

DATA_PLACEHOLDER = "<image>"


class QwenVisionPrompts(VisionPrompts):
    """VisionPrompts for the M-RoPE families; `hf_config` is the model's (for the rope index)."""

    def __init__(self, processor: Any, hf_config: Any) -> None:
        super().__init__(processor)
        self._rope = MRopeIndex(hf_config)
        self.max_images = 0  # images of the dataset's fullest row, known once every row is expanded

    def mark_images(self, text: str) -> str:
        """`text` with the data's `<image>` framed as Qwen's chat templates write an image."""
        start = getattr(self.processor, "vision_start_token", "<|vision_start|>")
        end = getattr(self.processor, "vision_end_token", "<|vision_end|>")
        return text.replace(DATA_PLACEHOLDER, f"{start}{self.placeholder}{end}")

    def expansion(self, size: tuple[int, int]) -> tuple[list[int], int]:
        """(the `<|image_pad|>` ids one image of `size` (w, h) expands to, its patches t*h*w)."""
        if size not in self._expansions:
            from PIL import Image

            out = self.processor(text=self.placeholder, images=[Image.new("RGB", size)], add_special_tokens=False,
                                 return_tensors="pt")
            self._expansions[size] = (out["input_ids"][0].tolist(), int(out["image_grid_thw"][0].prod()))
            self.tile_shape = (int(out["pixel_values"].shape[-1]),)
        return self._expansions[size]

    def expand(self, ids: Sequence[int], images: Sequence[Any], where: str) -> tuple[list[int], int]:
        self.max_images = max(self.max_images, len(images))
        return super().expand(ids, images, where)

    def pixel_tensors(self, images_per_row: Sequence[Sequence[Any]], slots: int) -> dict[str, torch.Tensor]:
        """`pixel_values` (rows, slots, C*T*P*P) and `image_grid_thw` (rows, max_images, 3): each row's images
        through the image processor once, zeros after them."""
        (patch_dim,) = self.tile_shape
        rows = len(images_per_row)
        values = torch.zeros((rows, slots, patch_dim), dtype=torch.float32)
        grids = torch.zeros((rows, max(self.max_images, 1), 3), dtype=torch.long)
        for row, images in enumerate(images_per_row):
            if not images:
                continue
            out = self.processor.image_processor(list(images), return_tensors="pt")
            self.images_processed += len(images)
            patches = out["pixel_values"]
            values[row, : patches.shape[0]] = patches
            grids[row, : len(images)] = out["image_grid_thw"]
        return {"pixel_values": values, "image_grid_thw": grids}

    def position_tensors(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         pixels: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`mrope_position_ids` (rows, 3, prompt_len) of the collated, left-padded prompts."""
        return {MROPE_POSITIONS: self._rope.prompt_positions(input_ids, attention_mask, pixels["image_grid_thw"])}
