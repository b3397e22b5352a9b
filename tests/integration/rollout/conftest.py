"""Fixtures of the rollout tests: the tiny model folder, its tokenizer, the HF reference model, a prompt batch."""

import pytest
from batch_helpers import prompt_batch as make_prompt_batch
from rollout_helpers import load_hf_model
from transformers import AutoTokenizer

from verl_like.models.tiny import build_tiny_model

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
    return make_prompt_batch(tiny_tokenizer, PROMPT_TEXTS)


@pytest.fixture(scope="session")
def vlm_dataset(tiny_vlm_dir, tmp_path_factory):
    """4 rows of the synthetic counting task (one picture each) on the tiny VLM's processor."""
    from verl_like.config.data import DataConfig
    from verl_like.data.dataset import RLDataset
    from verl_like.data.preprocess import write_rows
    from verl_like.data.synthetic import generate_split
    from verl_like.data.vision import load_processor

    path = write_rows(generate_split("count", "test", 4), tmp_path_factory.mktemp("vision_data") / "count.parquet")
    processor = load_processor(str(tiny_vlm_dir))
    return RLDataset([str(path)], processor.tokenizer, DataConfig(train_files=str(path), max_prompt_length=40),
                     processor)


@pytest.fixture(scope="session")
def vlm_trainer_model(tiny_vlm_dir):
    """The trainer's model of the tiny VLM (the engine's own loader), fp32, eval mode."""
    from verl_like.engine.config import EngineConfig
    from verl_like.engine.model_loading import load_model

    return load_model(EngineConfig(model_path=str(tiny_vlm_dir), dtype="float32")).eval()
