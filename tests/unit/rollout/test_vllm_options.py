"""How VLLMEngineOptions become `vllm.LLM` arguments, and the launch checks (no engine is started here)."""

import pytest

from verl_like.rollout.vllm import VLLMEngineOptions, VLLMRolloutEngine, build_llm_kwargs


def test_single_rank_runs_the_uni_executor_with_processed_logprobs():
    options = VLLMEngineOptions(dtype="float32", seed=3, max_num_seqs=8, enforce_eager=False)
    kwargs = build_llm_kwargs("/m", options)
    assert kwargs["distributed_executor_backend"] == "uni"
    assert kwargs["logprobs_mode"] == "processed_logprobs"
    assert (kwargs["dtype"], kwargs["seed"]) == ("float32", 3)
    assert (kwargs["max_num_seqs"], kwargs["enforce_eager"]) == (8, False)
    assert kwargs["enable_sleep_mode"] is False  # no CUDA here
    assert "max_model_len" not in kwargs and "kv_cache_memory_bytes" not in kwargs


def test_tensor_parallel_uses_the_external_launcher_and_optional_sizes_pass_through():
    options = VLLMEngineOptions(tensor_parallel_size=2, max_model_len=128, kv_cache_memory_bytes=1 << 20,
                                gpu_memory_utilization=0.3, enable_prefix_caching=False, load_format="dummy")
    kwargs = build_llm_kwargs("/m", options)
    assert kwargs["distributed_executor_backend"] == "external_launcher"
    assert kwargs["tensor_parallel_size"] == 2
    assert kwargs["max_model_len"] == 128 and kwargs["kv_cache_memory_bytes"] == 1 << 20
    assert kwargs["gpu_memory_utilization"] == 0.3
    assert kwargs["enable_prefix_caching"] is False and kwargs["load_format"] == "dummy"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(tensor_parallel_size=0), "tensor_parallel_size=0"),
        (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization=1.5"),
        (dict(load_format="pt"), "load_format='pt'"),
        (dict(sleep_level=3), "sleep_level=3"),
    ],
)
def test_invalid_options_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        VLLMEngineOptions(**kwargs)


def test_engine_refuses_the_multiprocess_engine(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    with pytest.raises(RuntimeError, match="VLLM_ENABLE_V1_MULTIPROCESSING=0"):
        VLLMRolloutEngine("/m")


def test_tensor_parallel_needs_a_distributed_world():
    with pytest.raises(RuntimeError, match="initialized torch.distributed world of 2 ranks"):
        VLLMRolloutEngine("/m", VLLMEngineOptions(tensor_parallel_size=2))
