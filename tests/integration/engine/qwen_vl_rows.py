"""Synthetic Qwen2-VL image rows for the engine tests (no processor: patches and grids are made here), and the
float64 single-row HF reference, which lets the model compute its own M-RoPE positions.

A prompt is `text <|vision_start|> <|image_pad|> x k <|vision_end|> ... text`, with one or two images of different
grids; k = t*h*w / 4 (spatial merge 2). Prompts are left-padded, responses right-padded, as the rollout builds them.
"""

from __future__ import annotations

import torch

from verl_like.data.mrope import MRopeIndex, continue_positions
from verl_like.models.tiny_qwen_vl import IMAGE_PAD, VISION_END, VISION_START

PROMPT_LEN = 40
RESPONSE_LEN = 6
TEMPERATURE = 0.7
# Per row: the (t, h, w) patch grid of each image.
ROW_GRIDS = [[(1, 4, 4)], [(1, 4, 8), (1, 4, 4)], [(1, 8, 4)], [(1, 4, 4), (1, 4, 4)], [(1, 8, 8)], [(1, 4, 6)]]


def image_rows(hf_config, tokenizer, seed: int = 0, row_grids=ROW_GRIDS) -> dict[str, torch.Tensor]:
    """The batch tensors the dataset and the rollout would make: ids, masks, text and M-RoPE positions, padded
    pixel patches (rows, patches, C*T*P*P) and grids (rows, images, 3)."""
    generator = torch.Generator().manual_seed(seed)
    vision = hf_config.vision_config
    patch_dim = vision.in_channels * vision.temporal_patch_size * vision.patch_size ** 2
    start, end, pad = (tokenizer.convert_tokens_to_ids(t) for t in (VISION_START, VISION_END, IMAGE_PAD))
    text_ids = torch.arange(7, 7 + 40)  # characters of the tiny alphabet, never a vision token
    rows = len(row_grids)
    most_patches = max(sum(t * h * w for t, h, w in grids) for grids in row_grids)
    most_images = max(len(grids) for grids in row_grids)
    input_ids = torch.zeros((rows, PROMPT_LEN + RESPONSE_LEN), dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    pixel_values = torch.zeros((rows, most_patches, patch_dim))
    image_grid_thw = torch.zeros((rows, most_images, 3), dtype=torch.long)
    for row, grids in enumerate(row_grids):
        prompt: list[int] = []
        for grid in grids:
            prompt += _text(text_ids, 1 + row % 3, generator) + [start] + [pad] * (grid[0] * grid[1] * grid[2] // 4)
            prompt += [end]
        prompt += _text(text_ids, 2 + row % 2, generator)
        assert len(prompt) <= PROMPT_LEN, len(prompt)
        response_valid = 1 + row % RESPONSE_LEN
        input_ids[row, PROMPT_LEN - len(prompt):PROMPT_LEN] = torch.tensor(prompt)
        input_ids[row, PROMPT_LEN:PROMPT_LEN + response_valid] = torch.tensor(_text(text_ids, response_valid,
                                                                                    generator))
        attention_mask[row, PROMPT_LEN - len(prompt):PROMPT_LEN + response_valid] = 1
        patches = sum(t * h * w for t, h, w in grids)
        pixel_values[row, :patches] = torch.randn((patches, patch_dim), generator=generator)
        image_grid_thw[row, :len(grids)] = torch.tensor(grids)
    prompt_positions = MRopeIndex(hf_config).prompt_positions(input_ids[:, :PROMPT_LEN],
                                                              attention_mask[:, :PROMPT_LEN], image_grid_thw)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": torch.clamp(attention_mask.cumsum(dim=1) - 1, min=0),
        "mrope_position_ids": continue_positions(prompt_positions, RESPONSE_LEN),
        "responses": input_ids[:, PROMPT_LEN:],
        "response_mask": attention_mask[:, PROMPT_LEN:],
        "pixel_values": pixel_values,
        "image_grid_thw": image_grid_thw,
        "advantages": torch.randn((rows, RESPONSE_LEN), generator=generator),
    }


def _text(ids: torch.Tensor, count: int, generator: torch.Generator) -> list[int]:
    return ids[torch.randint(0, len(ids), (count,), generator=generator)].tolist()


def reference_log_probs(model, batch: dict[str, torch.Tensor], temperature: float = TEMPERATURE) -> torch.Tensor:
    """(rows, RESPONSE_LEN) log-probs of the response tokens, one unpadded row at a time through the HF model,
    which computes its own M-RoPE positions from `mm_token_type_ids` and the row's grids (0 off the mask)."""
    image_token_id = model.config.image_token_id
    out = torch.zeros(batch["responses"].shape, dtype=torch.float64)
    for row in range(batch["input_ids"].shape[0]):
        valid = batch["attention_mask"][row].bool()
        ids = batch["input_ids"][row][valid][None]
        grids = batch["image_grid_thw"][row]
        grids = grids[grids.prod(-1) > 0]
        patches = int(grids.prod(-1).sum())
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False,
                       pixel_values=batch["pixel_values"][row, :patches].to(torch.float64), image_grid_thw=grids,
                       mm_token_type_ids=(ids == image_token_id).int()).logits[0].double() / temperature
        response_valid = int(batch["response_mask"][row].sum())
        prompt_valid = ids.shape[1] - response_valid
        log_probs = torch.log_softmax(logits[prompt_valid - 1:-1], dim=-1)
        tokens = ids[0, prompt_valid:]
        out[row, :response_valid] = log_probs.gather(-1, tokens[:, None])[:, 0]
    return out
