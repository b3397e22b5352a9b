"""M-RoPE position ids of Qwen2-VL / Qwen2.5-VL: made once per prompt, continued over the response.

These models rotate each token by three positions (temporal, height, width). Text tokens have the same value in all
three. An image's tokens take their grid coordinates, offset by where the image starts. Text after an image
continues from the largest position so far plus one. The prompt's positions come from the HF model's own
`get_rope_index`, on a skeleton of the model built on the meta device (no weights), when the dataset collates a
batch. The response tokens are text, so their positions count on from the prompt's largest position plus one
(`continue_positions`). Rows are stored as (rows, 3, seq_len) in the batch's `mrope_position_ids`. `position_ids`
stays the 2-D text position, as for every other model. The engine hands the model (3, rows, seq_len)
(engine/vision.py).

Version difference, kept here: transformers 5.19's `get_rope_index` takes `mm_token_type_ids` (0 text, 1 image),
which earlier releases do not. It is passed only when the signature names it.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

MROPE_POSITIONS = "mrope_position_ids"  # batch key: (rows, 3, seq_len)
MROPE_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl")


class MRopeIndex:
    """`prompt_positions` for one model config, through the HF model's `get_rope_index`."""

    def __init__(self, hf_config: Any) -> None:
        from transformers import AutoModel

        with torch.device("meta"):
            self._model = AutoModel.from_config(hf_config)  # the inner Qwen2VLModel / Qwen2_5_VLModel
        self._takes_token_types = "mm_token_type_ids" in inspect.signature(self._model.get_rope_index).parameters
        self.image_token_id = int(hf_config.image_token_id)

    def prompt_positions(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         image_grid_thw: torch.Tensor) -> torch.Tensor:
        """(rows, 3, prompt_len) positions of left-padded prompts (padding: 0); `image_grid_thw` (rows, images, 3),
        zero rows for empty image slots."""
        grids = image_grid_thw[image_grid_thw.prod(dim=-1) > 0]  # row order, then image order: the placeholders'
        kwargs: dict[str, Any] = {"image_grid_thw": grids if len(grids) else None, "attention_mask": attention_mask}
        if self._takes_token_types:
            kwargs["mm_token_type_ids"] = (input_ids == self.image_token_id).int()
        with torch.no_grad():
            positions, _ = self._model.get_rope_index(input_ids, **kwargs)
        return positions.transpose(0, 1).contiguous()


def continue_positions(prompt_positions: torch.Tensor, response_len: int) -> torch.Tensor:
    """(rows, 3, prompt_len + response_len): the prompt's positions, then text positions counting on from its
    largest position plus one (what `get_rope_index` gives text after the prompt)."""
    start = prompt_positions.amax(dim=(1, 2), keepdim=True) + 1  # (rows, 1, 1)
    offsets = torch.arange(response_len, dtype=prompt_positions.dtype, device=prompt_positions.device)
    response = (start + offsets.view(1, 1, -1)).expand(-1, 3, -1)
    return torch.cat([prompt_positions, response], dim=2)
