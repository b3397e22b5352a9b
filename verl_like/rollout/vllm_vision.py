"""Image prompts on the in-process vLLM engine: requests with `multi_modal_data`, the expansion read back.

What the dataset hands over (data/vision.py): per row `raw_prompt_ids` (one placeholder per image) and
`multi_modal_data` ({"image": [PIL images]}, None for a text row); `input_ids` hold the expanded prompt the trainer
reads. vLLM gets the unexpanded ids (it expands them itself; an expanded prompt would be expanded twice), processes
each prompt's images once for all n samples of the request (`SamplingParams.n`), and reports the expanded ids it
ran, which must equal the trainer's or the two would score different sequences ("image features and image tokens
do not match"); a difference raises naming the row.

The image placeholder is never sampled: a sampled `<image>` id in a response has no image features, so the trainer's
forward would fail. Every request of a vision-language engine therefore carries `allowed_token_ids` without it,
and the trainer's model masks the same logit (engine/vision.py), so both log-probs are over the same vocabulary.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_like.data.mrope import MROPE_MODEL_TYPES
from verl_like.data.vision import MULTI_MODAL_DATA, RAW_PROMPT_IDS
from verl_like.protocol import DataProto


def vision_llm_kwargs(model_path: str) -> dict[str, Any]:
    """Extra `vllm.LLM` arguments for the model at `model_path` ({} for all but Qwen2-VL / Qwen2.5-VL).

    Qwen2-VL / Qwen2.5-VL: no video (`limit_mm_per_prompt` video 0: vLLM then neither profiles nor accepts video;
    images keep vLLM's default limit). vLLM's model file for them imports torchvision, through transformers' image
    processor; where torchvision does not load (its PyPI build on CPU machines) this raises naming it, instead of
    vLLM's "Model architectures [...] failed to be inspected"."""
    config_file = Path(model_path) / "config.json"
    model_type = json.loads(config_file.read_text()).get("model_type") if config_file.is_file() else None
    if model_type not in MROPE_MODEL_TYPES:
        return {}
    try:
        import torchvision  # noqa: F401
    except Exception as error:  # noqa: BLE001 - a missing or a broken build: both stop vLLM's model file
        raise RuntimeError(
            f"{model_path}: vLLM's {model_type} model file imports torchvision (through transformers' Qwen2-VL "
            f"image processor), which does not load here ({type(error).__name__}: {error}); run Qwen2-VL / "
            "Qwen2.5-VL rollouts where torchvision does (the GPU image; docs/vision.md)"
        ) from error
    return {"limit_mm_per_prompt": {"video": 0}}


@dataclass(frozen=True)
class VisionEngineInfo:
    """The multimodal facts of one engine: the placeholder id and the vocabulary the sampler may draw from."""

    image_token_id: int
    allowed_token_ids: tuple[int, ...]


def engine_vision_info(llm: Any) -> VisionEngineInfo | None:
    """VisionEngineInfo of a multimodal `vllm.LLM`, None for a text model."""
    model_config = llm.llm_engine.vllm_config.model_config
    if not model_config.is_multimodal_model:
        return None
    image_token_id = getattr(model_config.hf_config, "image_token_id", None)
    if image_token_id is None:
        raise ValueError(f"{type(model_config.hf_config).__name__} names no image_token_id; only image-token "
                         "families (Idefics3 / SmolVLM, Qwen2-VL / Qwen2.5-VL) are supported (docs/vision.md)")
    vocab = model_config.get_vocab_size()
    return VisionEngineInfo(int(image_token_id), tuple(i for i in range(vocab) if i != image_token_id))


def sampling_fields(fields: dict[str, Any], info: VisionEngineInfo) -> dict[str, Any]:
    """`fields` (SamplingConfig.vllm_fields) restricted to the vocabulary without the image placeholder."""
    return {**fields, "allowed_token_ids": list(info.allowed_token_ids)}


def vision_requests(prompts: DataProto, token_lists: list[list[int]], images_sent: int) -> tuple[list[Any], int]:
    """(one vLLM prompt per row: its unexpanded ids with its images, or its ids alone for a text row or a batch
    without images; `images_sent` plus the images handed over)."""
    from vllm.inputs import TokensPrompt

    if MULTI_MODAL_DATA not in prompts.non_tensor_batch:
        return [TokensPrompt(prompt_token_ids=tokens) for tokens in token_lists], images_sent
    requests = []
    columns = prompts.non_tensor_batch[MULTI_MODAL_DATA], prompts.non_tensor_batch[RAW_PROMPT_IDS]
    for tokens, data, raw in zip(token_lists, *columns):
        if data:
            requests.append(TokensPrompt(prompt_token_ids=list(raw), multi_modal_data=dict(data)))
            images_sent += len(data.get("image", ()))
        else:
            requests.append(TokensPrompt(prompt_token_ids=list(tokens)))
    return requests, images_sent


def check_expansion(outputs: list[Any], token_lists: list[list[int]]) -> None:
    """Raises naming the first row whose prompt as vLLM expanded it differs from the trainer's `input_ids`."""
    for row, (output, expected) in enumerate(zip(outputs, token_lists)):
        got = list(output.prompt_token_ids)
        if got != list(expected):
            raise ValueError(
                f"rollout row {row}: vLLM expanded the image prompt to {len(got)} tokens but the dataset's "
                f"input_ids hold {len(expected)}; the processor beside the tokenizer and vLLM's disagree on the "
                "image tokens (the trainer would score another sequence than the one sampled)"
            )
