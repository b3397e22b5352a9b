"""Fixtures of the rollout tests: the tiny model folder, its tokenizer, the HF reference model, a prompt batch."""

import pytest
from rollout_helpers import load_hf_model
from transformers import AutoTokenizer

from verl_like.models.tiny import build_tiny_model
from verl_like.protocol import DataProto

PROMPT_TEXTS = ["1+2=?", "what is 3*4? answer:", "ab", "(7-5)*2 = "]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("rollout") / "tiny")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    return load_hf_model(tiny_model_dir)


@pytest.fixture(scope="session")
def prompt_batch(tiny_tokenizer):
    """Left-padded prompts of different lengths, with a uid column."""
    encoded = tiny_tokenizer(PROMPT_TEXTS, padding=True, padding_side="left", return_tensors="pt")
    mask = encoded["attention_mask"]
    return DataProto.from_dict(
        tensors=dict(
            input_ids=encoded["input_ids"], attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)
        ),
        non_tensors={"uid": [f"p{i}" for i in range(len(PROMPT_TEXTS))]},
    )
