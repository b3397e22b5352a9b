"""rollout.kv_cache_tokens (rollout/kv_cache.py): what the KV cache is asked for, per model, device and key value.

The per-token size is checked against vLLM's own allocation in tests/integration/rollout/test_vllm_rollout.py.
"""

import pytest
import transformers

from verl_like.config.errors import ConfigError
from verl_like.config.rollout import RolloutConfig
from verl_like.rollout import kv_cache
from verl_like.rollout.kv_cache import (
    KVCacheRequest, fitted_kv_bytes, kv_bytes_per_token, kv_cache_bytes, kv_cache_request, kv_cache_token_slots,
)

GiB = 1 << 30
# Qwen2.5-0.5B's attention: 24 layers, 14 query heads, 2 KV heads of 64.
QWEN_05B = transformers.Qwen2Config(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                                    num_key_value_heads=2, intermediate_size=4864)


def test_qwen_half_b_bytes_per_token_is_twelve_kib_in_bf16_and_splits_over_tp():
    assert kv_bytes_per_token(QWEN_05B, "bfloat16") == 2 * 24 * 2 * 64 * 2 == 12288
    assert kv_bytes_per_token(QWEN_05B, "float32") == 24576
    assert kv_bytes_per_token(QWEN_05B, "bfloat16", tensor_parallel_size=2) == 6144
    # Fewer KV heads than ranks: each rank keeps one head (replicated), as vLLM does.
    assert kv_bytes_per_token(QWEN_05B, "bfloat16", tensor_parallel_size=4) == 6144


def test_explicit_head_dim_and_vision_text_config_are_read():
    gemma = transformers.Gemma2Config(num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                                      head_dim=256, hidden_size=2304)
    assert kv_bytes_per_token(gemma, "bfloat16") == 2 * 4 * 4 * 256 * 2  # sliding layers counted as full
    vlm = transformers.Qwen2_5_VLConfig(text_config=dict(num_hidden_layers=3, num_attention_heads=4,
                                                         num_key_value_heads=2, hidden_size=64))
    assert kv_bytes_per_token(vlm, "float16") == 2 * 3 * 2 * 16 * 2


@pytest.mark.parametrize("config", [
    transformers.DeepseekV3Config(num_hidden_layers=2),                   # latent attention
    transformers.Qwen3NextConfig(num_hidden_layers=4),                    # linear-attention layers
    transformers.MambaConfig(num_hidden_layers=2),                        # no attention heads at all
], ids=["mla", "linear_attention", "mamba"])
def test_caches_laid_out_otherwise_are_left_to_vllm(config):
    assert kv_bytes_per_token(config, "bfloat16") is None


def test_slots_round_every_sequence_up_to_128_and_keep_one_spare():
    assert kv_cache_token_slots(256, 640) == 257 * 640
    assert kv_cache_token_slots(4, 200) == 5 * 256


def test_fit_keeps_the_need_when_it_fits_else_what_the_share_leaves():
    share = 0.3 * 141 * GiB
    room = int(share * (1 - kv_cache.RESERVE_FRACTION)) - kv_cache.RESERVE_BYTES - 1 * GiB
    assert fitted_kv_bytes(2 * GiB, 1 * GiB, 0.3, 141 * GiB) == 2 * GiB
    assert fitted_kv_bytes(500 * GiB, 1 * GiB, 0.3, 141 * GiB) == room
    assert fitted_kv_bytes(500 * GiB, 2 * GiB, 0.3, 141 * GiB, tensor_parallel_size=2) == room  # weights split
    assert fitted_kv_bytes(1 * GiB, 60 * GiB, 0.3, 141 * GiB) is None


def _model_dir(tmp_path, weight_bytes: int, dtype: str = "float32"):
    (tmp_path / "model.safetensors").write_bytes(b"\0" * weight_bytes)
    return tmp_path, transformers.Qwen2Config(**QWEN_05B.to_diff_dict(), dtype=dtype)


def test_null_on_cuda_asks_for_every_sequence_the_engine_holds_and_counts_weights_in_the_rollout_dtype(tmp_path):
    path, config = _model_dir(tmp_path, 4096)
    rollout = RolloutConfig(prompt_length=128, response_length=512, max_num_seqs=256)
    request = kv_cache_request(rollout, config, path, "cuda")
    # 257 sequences of 640 tokens at 12 KiB (bf16 rollout) = 1.88 GiB; fp32 checkpoint of 4,096 bytes -> 2,048
    assert request == KVCacheRequest(257 * 640 * 12288, weight_bytes=2048, fit=True)
    assert kv_cache_bytes(request, 0.3, 141 * GiB) == request.needed
    assert kv_cache_request(rollout, config, path, "cpu") is None  # $VLLM_CPU_KVCACHE_SPACE's cache


def test_a_number_is_exact_on_any_device_and_minus_one_leaves_vllm_to_size(tmp_path):
    path, config = _model_dir(tmp_path, 16)
    rollout = RolloutConfig(prompt_length=128, response_length=128, kv_cache_tokens=1000)
    request = kv_cache_request(rollout, config, path, "cpu")
    assert request == KVCacheRequest((8 + 1) * 128 * 12288)  # 1000 -> 1024, + one block-rounded sequence
    assert kv_cache_bytes(request, 0.3, 1) == request.needed  # not fitted: the user's size
    auto = RolloutConfig(prompt_length=128, response_length=128, kv_cache_tokens=-1)
    assert kv_cache_request(auto, config, path, "cuda") is None
    assert kv_cache_bytes(None, 0.3, 141 * GiB) is None


def test_a_number_for_a_latent_attention_model_is_refused_naming_the_key(tmp_path):
    rollout = RolloutConfig(prompt_length=128, response_length=128, kv_cache_tokens=4096)
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.rollout\.kv_cache_tokens=4096.*=null or -1"):
        kv_cache_request(rollout, transformers.DeepseekV3Config(num_hidden_layers=2), tmp_path, "cuda")
    null = RolloutConfig(prompt_length=128, response_length=128)
    assert kv_cache_request(null, transformers.DeepseekV3Config(num_hidden_layers=2), tmp_path, "cuda") is None


def test_fewer_tokens_than_one_sequence_is_a_config_error():
    with pytest.raises(ConfigError, match=r"kv_cache_tokens=100 cannot hold one sequence of max_model_len = 256"):
        RolloutConfig(prompt_length=128, response_length=128, kv_cache_tokens=100)


def test_server_flags_carry_the_request(tmp_path, monkeypatch):
    from verl_like import serve
    from verl_like.rollout.vllm_server import VLLM_SERVER

    rollout = RolloutConfig(prompt_length=128, response_length=128, gpu_memory_utilization=0.3)
    fit = VLLM_SERVER.engine_args(rollout, kv_cache=KVCacheRequest(5 * GiB, weight_bytes=GiB, fit=True))
    assert fit[fit.index("--kv-cache-fit-bytes") + 1] == str(5 * GiB)
    assert fit[fit.index("--kv-cache-weight-bytes") + 1] == str(GiB) and "--kv-cache-memory-bytes" not in fit
    exact = VLLM_SERVER.engine_args(rollout, kv_cache=KVCacheRequest(7 << 20))
    assert exact[exact.index("--kv-cache-memory-bytes") + 1] == str(7 << 20)
    assert not any(arg.startswith("--kv-cache") for arg in VLLM_SERVER.engine_args(rollout))
    # verl_like.serve fits the request into the server device's share (its memory read without CUDA).
    monkeypatch.setattr(kv_cache, "cuda_device_bytes", lambda: 141 * GiB)
    assert serve.fitted_kv_args(5 * GiB, GiB, fit, 1) == ["--kv-cache-memory-bytes", str(5 * GiB)]
    monkeypatch.setattr(kv_cache, "cuda_device_bytes", lambda: 4 * GiB)
    assert serve.fitted_kv_args(5 * GiB, GiB, fit, 1) == []  # 0.3 x 4 GiB leaves nothing beside 1 GiB
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    assert "VLLM_CPU_KVCACHE_SPACE" not in serve.server_env("cpu", explicit_kv_cache=True)
    assert serve.server_env("cpu")["VLLM_CPU_KVCACHE_SPACE"] == "1"
