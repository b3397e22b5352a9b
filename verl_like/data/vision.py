"""Image prompts: images read from rows, placeholders expanded at the token level, pixels computed once per prompt.

A row holds its images under `data.image_key` (verl's `images`): a list whose entries are a file path, raw
encoded bytes, or verl's `{"bytes": ..., "path": ...}`; relative paths are taken from the data file's folder. The
prompt marks where each image goes with the model's placeholder (`<image>` written in the text, or an image
content part `{"type": "image"}` beside `{"type": "text", "text": ...}`). Each row is checked when the dataset
loads: the images exist and decode, and the prompt holds exactly one placeholder per image; a bad row is refused
with its file and row index, before Ray starts.

Token ids: `raw_prompt_ids` keep one placeholder per image (what vLLM takes: it expands them itself, and an
already-expanded prompt would be expanded twice); `input_ids` carry the expansion the processor makes for each image
(e.g. Idefics3's `<fake_token_around_image><global-img><image>*k<fake_token_around_image>`), computed once per image
size from a blank image of that size, so the length policy sees the real prompt length. The rollout checks vLLM's
expansion against these (rollout/vllm_vision.py). Pixels (`pixel_values`, `pixel_attention_mask`) are computed by
the image processor once per prompt when a batch is collated, padded with all-zero images to the dataset's image
slots (the model drops those), and then repeated with the prompt's n samples, never recomputed. Every row of data
with images must have at least one (`refuse_text_rows` says why).
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

logger = logging.getLogger(__name__)

MULTI_MODAL_DATA = "multi_modal_data"  # non-tensor column: {"image": [PIL images]} per row (None: no image)
RAW_PROMPT_IDS = "raw_prompt_ids"  # non-tensor column: prompt ids with one placeholder per image (verl's name)


def content_text(content: Any, where: str, image_placeholder: str = "<image>") -> str:
    """A message's content as text: a string as it is; a list of content parts joined, each image part as the
    placeholder. Raises ValueError naming `where` for any other shape or part type (video included)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, (list, tuple)):
        raise ValueError(f"{where} is a {type(content).__name__}; message content must be text or content parts")
    pieces = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            pieces.append(str(part.get("text") or ""))
        elif kind == "image":
            pieces.append(image_placeholder)
        elif kind == "video":
            raise ValueError(f"{where}[{i}] is a video part; video is not supported (images only; docs/vision.md)")
        else:
            raise ValueError(f"{where}[{i}] is {part!r}; content parts must be {{'type': 'text', 'text': ...}} or "
                             "{'type': 'image'}")
    return "".join(pieces)


def open_image(value: Any, where: str, base_dir: str | os.PathLike = "."):
    """The PIL image (RGB) of one `images` entry: a path, encoded bytes or {"bytes", "path"}; ValueError naming
    `where` for a missing file or undecodable bytes."""
    from PIL import Image

    if isinstance(value, dict):
        value = value.get("bytes") or value.get("path") or value.get("image")
    try:
        if isinstance(value, (bytes, bytearray, memoryview)):
            image = Image.open(io.BytesIO(bytes(value)))
        elif isinstance(value, (str, os.PathLike)):
            path = Path(value).expanduser()
            path = path if path.is_absolute() else Path(base_dir) / path
            if not path.is_file():
                raise ValueError(f"{where}: image file {str(path)!r} does not exist")
            image = Image.open(path)
        else:
            raise ValueError(f"{where} is a {type(value).__name__}; give a path, encoded bytes or {{'bytes': ...}}")
        return image.convert("RGB")
    except ValueError:
        raise
    except Exception as error:  # PIL raises UnidentifiedImageError, OSError, ...
        raise ValueError(f"{where}: not a readable image ({type(error).__name__}: {error})") from error


def row_images(record: dict[str, Any], image_key: str, where: str, base_dir: str | os.PathLike) -> tuple:
    """The row's images, each opened once here to check it (kept as the PIL image); () when it has none."""
    value = record.get(image_key)
    if value is None:
        return ()
    if isinstance(value, (str, bytes, dict)):
        value = [value]
    return tuple(open_image(entry, f"{where}: field '{image_key}[{i}]'", base_dir) for i, entry in enumerate(value))


@dataclass
class VisionPrompts:
    """A model's processor seen from the dataset: placeholder ids, their per-image expansion, pixel batches.

    `images_processed` counts images through the image processor (tests check each image is processed once per
    prompt of a batch, whatever the rollout's n).
    """

    processor: Any
    images_processed: int = 0

    def __post_init__(self) -> None:
        self.tokenizer = self.processor.tokenizer
        self.placeholder = getattr(self.processor, "image_token", "<image>")
        self.image_token_id = int(self.tokenizer.convert_tokens_to_ids(self.placeholder))
        self._expansions: dict[tuple[int, int], tuple[list[int], int]] = {}
        self.tile_shape: tuple[int, ...] = ()  # (C, H, W) of one pixel tile, known after the first expansion

    def mark_images(self, text: str) -> str:
        """The templated prompt text as this family's tokenizer expects its image placeholders (Idefics3: as is)."""
        return text

    def position_tensors(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         pixels: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Position tensors a family needs beside `position_ids` for a collated batch (Idefics3: none)."""
        return {}

    def expansion(self, size: tuple[int, int]) -> tuple[list[int], int]:
        """(the token ids one image of `size` (w, h) expands to, its pixel slots: tiles + global image)."""
        if size not in self._expansions:
            from PIL import Image

            out = self.processor(text=self.placeholder, images=[Image.new("RGB", size)], add_special_tokens=False,
                                 return_tensors="pt")
            self._expansions[size] = (out["input_ids"][0].tolist(), int(out["pixel_values"].shape[1]))
            self.tile_shape = tuple(out["pixel_values"].shape[2:])
        return self._expansions[size]

    def expand(self, ids: Sequence[int], images: Sequence[Any], where: str) -> tuple[list[int], int]:
        """(ids with each placeholder replaced by its image's expansion, pixel slots); ValueError naming `where`
        when the placeholder count differs from the image count."""
        places = [i for i, token in enumerate(ids) if token == self.image_token_id]
        if len(places) != len(images):
            raise ValueError(
                f"{where}: the prompt has {len(places)} image placeholder(s) {self.placeholder!r} but the row has "
                f"{len(images)} image(s); put one placeholder (or image content part) per image"
            )
        expanded: list[int] = []
        slots, start = 0, 0
        for place, image in zip(places, images):
            tokens, image_slots = self.expansion(image.size)
            expanded.extend(ids[start:place])
            expanded.extend(tokens)
            slots += image_slots
            start = place + 1
        expanded.extend(ids[start:])
        return expanded, slots

    def pixel_tensors(self, images_per_row: Sequence[Sequence[Any]], slots: int) -> dict[str, torch.Tensor]:
        """`pixel_values` (rows, slots, C, H, W) and `pixel_attention_mask` (rows, slots, H, W): each row's
        images through the image processor once, zero images in the unused slots (rows without images: all)."""
        per_row = []
        for images in images_per_row:
            if images:
                out = self.processor.image_processor(list(images), return_tensors="pt")
                self.images_processed += len(images)
                per_row.append((out["pixel_values"][0], out["pixel_attention_mask"][0]))
            else:
                per_row.append(None)
        shape = self.tile_shape
        values = torch.zeros((len(per_row), slots, *shape), dtype=torch.float32)
        mask = torch.zeros((len(per_row), slots, *shape[1:]), dtype=torch.bool)
        for i, piece in enumerate(per_row):
            if piece is None:
                continue
            if tuple(piece[0].shape[1:]) != shape:
                raise ValueError(f"the image processor gave pixel tiles of shape {tuple(piece[0].shape[1:])} and "
                                 f"{tuple(shape)} in one batch; use a processor that resizes every tile to one size")
            values[i, : piece[0].shape[0]] = piece[0]
            mask[i, : piece[1].shape[0]] = piece[1].bool()
        return {"pixel_values": values, "pixel_attention_mask": mask}


def object_column(values: list) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        array[i] = value
    return array


def load_processor(path: str, trust_remote_code: bool = False) -> Any | None:
    """The processor saved beside a model's tokenizer, or None for a text-only model (no image processor).

    Raises naming torchvision when a Qwen2-VL / Qwen2.5-VL processor cannot load for want of it: transformers'
    Qwen2-VL image and video processors import torchvision, and its PyPI build does not load on CPU machines."""
    from transformers import AutoProcessor

    if not (Path(path) / "preprocessor_config.json").is_file() and not (Path(path) / "processor_config.json").is_file():
        return None
    try:
        processor = AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
    except ImportError as error:
        if "torchvision" not in str(error).lower():
            raise
        raise RuntimeError(
            f"the processor of {path} ({type(error).__name__}: {str(error).strip().splitlines()[0]}) needs "
            "torchvision, which does not load on this machine; Qwen2-VL / Qwen2.5-VL image prompts run where "
            "torchvision does (the GPU image; docs/vision.md), or train an Idefics3 / SmolVLM model here"
        ) from error
    return processor if hasattr(processor, "image_processor") else None


def vision_prompts(processor: Any, model_path: str) -> VisionPrompts:
    """The VisionPrompts of the model at `model_path`: Qwen2-VL / Qwen2.5-VL's (M-RoPE, patches) or Idefics3's."""
    from transformers import AutoConfig

    from verl_like.data.mrope import MROPE_MODEL_TYPES

    hf_config = AutoConfig.from_pretrained(model_path)
    if hf_config.model_type in MROPE_MODEL_TYPES:
        from verl_like.data.vision_qwen import QwenVisionPrompts

        return QwenVisionPrompts(processor, hf_config)
    return VisionPrompts(processor)


def refuse_text_rows(rows: Sequence[Any], image_key: str) -> None:
    """Raises DataRowError naming the first row without images of data that has images: a micro-batch of text rows
    alone would run the vision tower on no image (Idefics3 fails), and skipping the tower on one rank would leave
    the others' FSDP all-gathers waiting. Mixed text and image data is not supported yet."""
    from verl_like.data.rows import DataRowError

    text_row = next((row for row in rows if not row.images), None)
    if text_row is not None:
        raise DataRowError(
            f"{text_row.file} row {text_row.row_index}: field {image_key!r} is empty, but other rows have images; "
            "mixing text and image rows in one run is not supported yet (docs/vision.md): give every row an image, "
            "or train on them separately"
        )


def check_vision_config(config: Any, *datasets: Any) -> None:
    """Refuses the settings image prompts do not support (config/vision.py) when any dataset holds images."""
    from verl_like.config.vision import check_vision_options

    if any(dataset is not None and dataset.vision is not None for dataset in datasets):
        check_vision_options(config)


def check_image_rows(files: Sequence[str], data_config: Any, placeholder: str = "<image>") -> int:
    """Reads every row of `files` (parquet/jsonl) that holds images and checks it as the dataset will: images
    exist and decode, and the prompt's text holds one `placeholder` per image. Raises DataRowError naming the file
    and row; returns the number of image rows. Run by the preflight, before Ray starts (the dataset repeats the
    placeholder check on token ids with the model's own processor)."""
    from verl_like.data.rows import DataRowError, load_rows

    rows = load_rows(list(files), data_config.prompt_key, data_config.reward_fn_key, data_config.image_key,
                     data_config.video_key)
    if any(row.images for row in rows):
        refuse_text_rows(rows, data_config.image_key)
    count = 0
    for row in rows:
        if not row.images:
            continue
        count += 1
        messages = [{"content": row.prompt}] if isinstance(row.prompt, str) else row.prompt
        found = sum(message["content"].count(placeholder) for message in messages)
        if found != len(row.images):
            raise DataRowError(
                f"{row.file} row {row.row_index}: the prompt has {found} image placeholder(s) {placeholder!r} but "
                f"the row has {len(row.images)} image(s); put one placeholder (or image content part) per image"
            )
    return count
