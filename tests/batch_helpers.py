"""Batches the integration and GPU tests build the same way (importable from any test: tests/ is on sys.path
through tests/conftest.py)."""

from __future__ import annotations

from verl_like.protocol import DataProto


def prompt_batch(tokenizer, texts: list[str]) -> DataProto:
    """A left-padded prompt batch of `texts` (input_ids, attention_mask, position_ids; uid "p<i>")."""
    encoded = tokenizer(texts, padding=True, padding_side="left", return_tensors="pt")
    mask = encoded["attention_mask"]
    return DataProto.from_dict(
        tensors=dict(input_ids=encoded["input_ids"], attention_mask=mask,
                     position_ids=(mask.cumsum(-1) - 1).clamp(min=0)),
        non_tensors={"uid": [f"p{i}" for i in range(len(texts))]},
    )
