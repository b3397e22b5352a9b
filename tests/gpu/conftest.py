"""GPU twins of the CPU integration tests: skipped unless CUDA is usable (run them on a GPU machine)."""

import pytest

from verl_like.utils.device import is_cuda_available


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "tests/gpu/" in str(item.fspath):
            item.add_marker(pytest.mark.gpu)
            if not is_cuda_available():
                item.add_marker(skip)


@pytest.fixture(scope="session")
def small_bf16_qwen2(tmp_path_factory):
    """A small random Qwen2 in bf16 with the tiny tokenizer (ids below its 1024-token vocabulary; vLLM reads the pad
    token from it): (directory, config). Built once per session."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verl_like.models.tiny import build_tokenizer

    config = Qwen2Config(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=1024, max_position_embeddings=1024, dtype="bfloat16")
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("small_bf16_qwen2") / "qwen2"
    Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
    build_tokenizer().save_pretrained(out)
    return str(out), config
