"""Megatron micro-batch inputs (verl_like.engine.megatron.outputs.model_inputs): padding cut, mask, positions."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict


def _batch(attention_mask: list[list[int]]) -> TensorDict:
    mask = torch.tensor(attention_mask)
    return TensorDict({
        "input_ids": torch.arange(mask.numel()).reshape(mask.shape) * mask,
        "attention_mask": mask,
        "position_ids": torch.clamp(mask.cumsum(1) - 1, min=0),
    }, batch_size=[mask.shape[0]])


def test_all_padding_columns_are_cut_and_the_mask_is_causal_and_padding():
    from verl_like.engine.megatron.outputs import model_inputs

    batch = _batch([[0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1]])
    inputs = model_inputs(batch, strip_padding=True)
    assert inputs.column_offset == 2
    assert torch.equal(inputs.input_ids, batch["input_ids"][:, 2:6])
    allowed = ~inputs.attention_mask[:, 0]
    # row 1 (valid columns 3..5 -> kept 1..3): query 2 sees keys 1, 2 only
    assert allowed[1, 2].tolist() == [False, True, True, False]
    # row 0: padding key at kept column 3 is never attended
    assert not allowed[0, :, 3].any()
    assert model_inputs(batch, strip_padding=False).column_offset == 0


def test_positions_that_rope_by_column_cannot_reproduce_are_refused():
    from verl_like.engine.megatron.outputs import model_inputs

    batch = _batch([[1, 0, 1, 1]])  # a hole: HF positions skip it, columns do not
    with pytest.raises(ValueError, match="contiguous run"):
        model_inputs(batch, strip_padding=False)
