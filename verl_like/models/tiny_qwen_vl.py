"""Builds a small random Qwen2-VL or Qwen2.5-VL (config, weights, tokenizer, processor configs) into a local folder.

Used by the CPU trainer tests (weights and config only: they build pixel patches themselves), the GPU twin test and
the `qwen25vl_1gpu` bench stage (random weights in a shape such as Qwen2.5-VL-3B's). The tokenizer is the tiny
character tokenizer (verl_like/models/tiny.py) plus Qwen's vision tokens; its shape is Qwen2Tokenizer's, which
transformers rebuilds for these model types. The processor configs are written as JSON, not through transformers'
Qwen2-VL image processor: that class imports torchvision, which does not load on the CPU machines (docs/vision.md).
On a machine with torchvision, `AutoProcessor` and vLLM load the folder; the processor resizes every image into
[min_pixels, max_pixels] (`image_side` square by default: (image_side / 14 / 2)^2 `<|image_pad|>` tokens).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from verl_like.models.tiny import write_folder_atomically
from verl_like.models.tiny_vlm import folder_built_from, text_model_fields, tokenizer_with, vision_spec_hash

logger = logging.getLogger(__name__)

VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"
VISION_TOKENS = (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)
# CLIP's mean / std, what Qwen2-VL's checkpoints ship.
_IMAGE_MEAN = [0.48145466, 0.4578275, 0.40821073]
_IMAGE_STD = [0.26862954, 0.26130258, 0.27577711]
_SPEC_FILE = "verl_like_tiny_qwen_vl_spec.json"


@dataclass(frozen=True)
class TinyQwenVLSpec:
    """Shape of the model; `model_type` "qwen2_vl" or "qwen2_5_vl"; `seed` fixes its random weights.

    head_dim = hidden_size / num_attention_heads; `mrope_section` (temporal, height, width) sums to head_dim / 2.
    `image_side`: the processor's pixel budget is image_side^2 (min and max), so a square image becomes
    (image_side / patch_size)^2 patches and a quarter as many `<|image_pad|>` tokens (spatial merge 2).
    """

    model_type: str = "qwen2_5_vl"
    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 256
    max_position_embeddings: int = 2048
    mrope_section: tuple[int, int, int] = (4, 6, 6)
    vision_depth: int = 2
    vision_hidden_size: int = 64
    vision_intermediate_size: int = 128
    vision_heads: int = 2
    patch_size: int = 14
    window_size: int = 56  # Qwen2.5-VL's window attention side in pixels (the checkpoints: 112)
    fullatt_block_indexes: tuple[int, ...] = ()  # Qwen2.5-VL's full-attention blocks; () = the last one
    image_side: int = 112
    torch_dtype: str = "float32"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.model_type not in ("qwen2_vl", "qwen2_5_vl"):
            raise ValueError(f"TinyQwenVLSpec.model_type={self.model_type!r}; use 'qwen2_vl' or 'qwen2_5_vl'")
        head_dim = self.hidden_size // self.num_attention_heads
        if sum(self.mrope_section) * 2 != head_dim:
            raise ValueError(f"mrope_section={self.mrope_section} must sum to head_dim / 2 = {head_dim // 2}")
        if self.image_side % (2 * self.patch_size):
            raise ValueError(f"image_side={self.image_side} must be a multiple of 2 * patch_size={2 * self.patch_size}")

    @property
    def image_tokens(self) -> int:
        """`<|image_pad|>` tokens one image expands to (after the 2 x 2 spatial merge)."""
        return (self.image_side // self.patch_size // 2) ** 2

    def spec_hash(self) -> str:
        return vision_spec_hash(self, VISION_TOKENS)


def build_qwen_vl_tokenizer():
    """The tiny character tokenizer with Qwen's vision tokens appended as special tokens."""
    return tokenizer_with(VISION_TOKENS)


def model_config(spec: TinyQwenVLSpec, tokenizer):
    """The HF config (Qwen2VLConfig or Qwen2_5_VLConfig) of `spec` over `tokenizer`'s vocabulary."""
    text = {
        **text_model_fields(spec, tokenizer),
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": list(spec.mrope_section)},
    }
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in (
        ("vision_start_token_id", VISION_START), ("vision_end_token_id", VISION_END), ("image_token_id", IMAGE_PAD),
        ("video_token_id", VIDEO_PAD))}
    if spec.model_type == "qwen2_vl":
        from transformers import Qwen2VLConfig as config_class

        vision = {"depth": spec.vision_depth, "embed_dim": spec.vision_hidden_size, "hidden_size": spec.hidden_size,
                  "mlp_ratio": spec.vision_intermediate_size // spec.vision_hidden_size, "num_heads": spec.vision_heads}
    else:
        from transformers import Qwen2_5_VLConfig as config_class

        # Window attention in most blocks, full attention in some (by default the last).
        vision = {"depth": spec.vision_depth, "hidden_size": spec.vision_hidden_size,
                  "intermediate_size": spec.vision_intermediate_size, "num_heads": spec.vision_heads,
                  "out_hidden_size": spec.hidden_size, "window_size": spec.window_size,
                  "fullatt_block_indexes": list(spec.fullatt_block_indexes or (spec.vision_depth - 1,))}
    vision.update(patch_size=spec.patch_size, spatial_merge_size=2, temporal_patch_size=2)
    return config_class(text_config=text, vision_config=vision, tie_word_embeddings=False, dtype=spec.torch_dtype,
                        **ids)


def model_class(model_type: str):
    """The HF class that trains this family (what AutoModelForImageTextToText picks)."""
    from transformers import Qwen2_5_VLForConditionalGeneration, Qwen2VLForConditionalGeneration

    return Qwen2VLForConditionalGeneration if model_type == "qwen2_vl" else Qwen2_5_VLForConditionalGeneration


def _processor_files(spec: TinyQwenVLSpec) -> dict[str, dict]:
    processor_class = "Qwen2VLProcessor" if spec.model_type == "qwen2_vl" else "Qwen2_5_VLProcessor"
    pixels = spec.image_side * spec.image_side
    common = {"do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
              "do_convert_rgb": True, "image_mean": _IMAGE_MEAN, "image_std": _IMAGE_STD, "min_pixels": pixels,
              "max_pixels": pixels, "size": {"shortest_edge": pixels, "longest_edge": pixels},
              "patch_size": spec.patch_size, "temporal_patch_size": 2, "merge_size": 2,
              "processor_class": processor_class}
    return {
        "preprocessor_config.json": {"image_processor_type": "Qwen2VLImageProcessor", **common},
        "video_preprocessor_config.json": {"video_processor_type": "Qwen2VLVideoProcessor", **common},
    }


def _is_built(out_dir: Path, spec: TinyQwenVLSpec) -> bool:
    return folder_built_from(out_dir, _SPEC_FILE, spec.spec_hash())


def build_tiny_qwen_vl(out_dir: str | os.PathLike, spec: TinyQwenVLSpec = TinyQwenVLSpec()) -> Path:
    """Writes the model, its tokenizer and processor configs to `out_dir` (idempotent; built beside it and renamed
    into place, so concurrent builders never see a half-written folder)."""
    from transformers import GenerationConfig

    out_dir = Path(out_dir)
    if _is_built(out_dir, spec):
        return out_dir
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / _SPEC_FILE).is_file():
        raise FileExistsError(f"out_dir={str(out_dir)!r} holds files build_tiny_qwen_vl did not write; pass a new "
                              "folder")
    tokenizer = build_qwen_vl_tokenizer()
    torch.manual_seed(spec.seed)
    model = model_class(spec.model_type)(model_config(spec, tokenizer)).to(getattr(torch, spec.torch_dtype))
    generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    def write(staging: Path) -> None:
        model.save_pretrained(staging, safe_serialization=True)
        generation_config.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        for name, content in _processor_files(spec).items():
            (staging / name).write_text(json.dumps(content, indent=2))
        (staging / _SPEC_FILE).write_text(
            json.dumps({"hash": spec.spec_hash(), "spec": dataclasses.asdict(spec)}, indent=2)
        )

    write_folder_atomically(out_dir, write, lambda: _is_built(out_dir, spec))
    logger.info("built %s (%d parameters) in %s", spec.model_type, sum(p.numel() for p in model.parameters()), out_dir)
    return out_dir
