"""RolloutConfig: validation naming the key, and what it becomes (SamplingConfig, vLLM engine arguments). No engine."""

import re

import pytest

from verl_like.config.errors import ConfigError
from verl_like.config.rollout import RolloutConfig, RolloutValKwargs
from verl_like.rollout.base import SamplingConfig
from verl_like.rollout.from_config import sampling_config, vllm_engine_options
from verl_like.rollout.vllm import build_llm_kwargs


def test_training_sampling_follows_the_config():
    config = RolloutConfig(temperature=0.7, top_p=0.9, top_k=20, n=4, response_length=64, ignore_eos=True)
    assert sampling_config(config) == SamplingConfig(
        n=4, temperature=0.7, top_p=0.9, top_k=20, max_tokens=64, ignore_eos=True, do_sample=True
    )
    assert sampling_config(RolloutConfig(top_k=-1)).top_k is None
    assert sampling_config(RolloutConfig(top_k=0)).top_k is None


@pytest.mark.parametrize("overrides", [dict(temperature=0.0), dict(do_sample=False)], ids=["temperature0", "no_sample"])
def test_greedy_when_temperature_is_zero_or_sampling_is_off(overrides):
    sampling = sampling_config(RolloutConfig(n=3, response_length=16, **overrides))
    assert sampling.greedy and sampling.n == 3 and sampling.max_tokens == 16


def test_validation_uses_val_kwargs_and_greedy_forces_one_argmax_sample():
    config = RolloutConfig(temperature=1.0, n=8, val_kwargs=RolloutValKwargs(temperature=0.5, top_p=0.8, top_k=5,
                                                                             n=2, do_sample=True))
    assert sampling_config(config, validate=True) == SamplingConfig(
        n=2, temperature=0.5, top_p=0.8, top_k=5, max_tokens=512, do_sample=True
    )
    assert sampling_config(RolloutConfig(), validate=True).greedy  # the default val_kwargs decode greedily
    greedy = sampling_config(config, greedy=True)
    assert greedy.greedy and greedy.n == 1


def test_vllm_options_become_the_engine_arguments():
    config = RolloutConfig(tensor_model_parallel_size=2, dtype="float16", gpu_memory_utilization=0.3,
                           enforce_eager=False, load_format="auto", enable_prefix_caching=False, max_num_seqs=7,
                           seed=11, prompt_length=100, response_length=28)
    kwargs = build_llm_kwargs("/model", vllm_engine_options(config))
    assert kwargs["tensor_parallel_size"] == 2 and kwargs["distributed_executor_backend"] == "external_launcher"
    assert (kwargs["dtype"], kwargs["gpu_memory_utilization"], kwargs["enforce_eager"]) == ("float16", 0.3, False)
    assert (kwargs["load_format"], kwargs["enable_prefix_caching"]) == ("auto", False)
    assert (kwargs["max_num_seqs"], kwargs["seed"], kwargs["max_model_len"]) == (7, 11, 128)
    assert vllm_engine_options(RolloutConfig(max_model_len=4096)).max_model_len == 4096
    assert RolloutConfig(update_weights_bucket_megabytes=3).bucket_bytes == 3 << 20


@pytest.mark.parametrize(
    "overrides, key",
    [
        (dict(name="sglang"), "rollout.name='sglang'"),
        (dict(tensor_model_parallel_size=0), "rollout.tensor_model_parallel_size=0"),
        (dict(name="hf", tensor_model_parallel_size=2), "rollout.name='hf' runs without tensor parallelism"),
        (dict(dtype="int8"), "rollout.dtype='int8'"),
        (dict(gpu_memory_utilization=0.0), "rollout.gpu_memory_utilization=0.0"),
        (dict(load_format="pt"), "rollout.load_format='pt'"),
        (dict(response_length=0), "rollout.prompt_length=512 and actor_rollout_ref.rollout.response_length=0"),
        (dict(max_model_len=100), "rollout.max_model_len=100 is below prompt_length"),
        (dict(max_num_seqs=0), "rollout.max_num_seqs=0"),
        (dict(temperature=-1.0), "rollout.temperature=-1.0"),
        (dict(top_p=1.5), "rollout.top_p=1.5"),
        (dict(top_k=-3), "rollout.top_k=-3"),
        (dict(n=0), "rollout.n=0"),
        (dict(log_prob_micro_batch_size_per_gpu=0), "rollout.log_prob_micro_batch_size_per_gpu=0"),
        (dict(log_prob_max_token_len_per_gpu=0), "rollout.log_prob_max_token_len_per_gpu=0"),
        (dict(update_weights_bucket_megabytes=0), "rollout.update_weights_bucket_megabytes=0"),
        (dict(weight_sync_mode="nccl"), "rollout.weight_sync_mode='nccl'"),
        (dict(weight_sync_timeout_s=0), "rollout.weight_sync_timeout_s=0"),
    ],
)
def test_bad_values_name_the_key(overrides, key):
    with pytest.raises(ConfigError, match=re.escape(f"actor_rollout_ref.{key}")):
        RolloutConfig(**overrides)


def test_bad_val_kwargs_name_their_key():
    with pytest.raises(ConfigError, match="actor_rollout_ref.rollout.val_kwargs.n=0"):
        RolloutValKwargs(n=0)
