"""rollout.kv_cache_tokens on CUDA (rollout/kv_cache.py): the in-process engine's KV cache under null is what
max_num_seqs sequences of max_model_len hold (vLLM allocates exactly the blocks asked for, far below what
gpu_memory_utilization would have given it), it generates every sequence of a full batch at once, and -1 gives
vLLM's own sizing back. (tests/gpu/test_server_mode_gpu.py's server runs under the null default too.)
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("vllm")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from verl_like.config.rollout import RolloutConfig  # noqa: E402
from verl_like.protocol import DataProto  # noqa: E402
from verl_like.rollout.backends import EngineBuild, build_rollout_engine  # noqa: E402
from verl_like.rollout.base import SamplingConfig  # noqa: E402
from verl_like.rollout.kv_cache import kv_bytes_per_token, kv_cache_token_slots  # noqa: E402

SEQS, PROMPT, RESPONSE = 64, 32, 96


@pytest.fixture(scope="module")
def model_dir(small_bf16_qwen2):
    return small_bf16_qwen2


def _engine(model_dir, kv_cache_tokens):
    path, config = model_dir
    rollout = RolloutConfig(dtype="bfloat16", prompt_length=PROMPT, response_length=RESPONSE, max_num_seqs=SEQS,
                            gpu_memory_utilization=0.3, kv_cache_tokens=kv_cache_tokens, load_format="auto")
    return build_rollout_engine(EngineBuild(path, rollout, config)), config


def _blocks_tokens(engine) -> int:
    cache = engine.llm.llm_engine.vllm_config.cache_config
    return cache.num_gpu_blocks * cache.block_size


def test_null_sizes_the_cache_to_the_sequences_the_engine_holds_and_a_full_batch_runs_at_once(model_dir):
    engine, config = _engine(model_dir, None)
    try:
        slots = kv_cache_token_slots(SEQS, PROMPT + RESPONSE)
        assert engine.options.kv_cache_memory_bytes == slots * kv_bytes_per_token(config, "bfloat16")
        assert _blocks_tokens(engine) == slots
        prompts = DataProto.from_dict(tensors={
            "input_ids": torch.randint(10, 40, (SEQS // 4, PROMPT)),
            "attention_mask": torch.ones(SEQS // 4, PROMPT, dtype=torch.long),
            "position_ids": torch.arange(PROMPT).expand(SEQS // 4, PROMPT).clone(),
        })
        out = engine.generate(prompts, SamplingConfig(n=4, max_tokens=RESPONSE, ignore_eos=True, seed=0))
        assert out.batch["response_mask"].sum() == SEQS * RESPONSE
    finally:
        engine.shutdown()


def test_minus_one_gives_vllm_its_own_sizing(model_dir):
    engine, _ = _engine(model_dir, -1)
    try:
        assert engine.options.kv_cache_memory_bytes is None
        assert _blocks_tokens(engine) > 10 * kv_cache_token_slots(SEQS, PROMPT + RESPONSE)
    finally:
        engine.shutdown()
