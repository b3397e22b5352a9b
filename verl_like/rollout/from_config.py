"""What the `actor_rollout_ref.rollout` node becomes on the rollout side: sampling settings and engine options.

    sampling = sampling_config(rollout, validate=False)            # SamplingConfig of a training rollout
    options = vllm_engine_options(rollout, trust_remote_code=True)  # VLLMEngineOptions of the in-process engine
    options = vllm_options(build) / hf_options(build)               # the registry entries' options (backends.py)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from verl_like.config.rollout import RolloutConfig, rescorable
from verl_like.rollout.base import SamplingConfig

if TYPE_CHECKING:
    from verl_like.rollout.backends import EngineBuild
    from verl_like.rollout.vllm import VLLMEngineOptions


def sampling_config(rollout: RolloutConfig, validate: bool = False, greedy: bool = False) -> SamplingConfig:
    """The SamplingConfig of a training rollout, a validation rollout (`val_kwargs`), or greedy decoding
    (one sample, argmax; e.g. ReMax's baseline). temperature 0 or do_sample False also mean greedy. The
    sampled tokens' log-probs are asked for unless rollout.calculate_log_probs is false (null counts as true),
    made as rollout.log_probs_from says; a call whose sampling rescoring cannot reproduce (a validation
    temperature, say) decodes them."""
    source = rollout.val_kwargs if validate else rollout
    log_probs = rollout.calculate_log_probs is not False
    if greedy or not source.do_sample or source.temperature == 0:
        n = 1 if greedy else source.n
        return SamplingConfig(n=n, do_sample=False, max_tokens=rollout.response_length, ignore_eos=rollout.ignore_eos,
                              log_probs=log_probs, log_probs_from=rollout.log_probs_from)
    top_k = source.top_k if source.top_k > 0 else None
    log_probs_from = rollout.log_probs_from
    if not rescorable(source.temperature, source.top_p, top_k, True):
        log_probs_from = "decode"
    return SamplingConfig(
        n=source.n,
        temperature=source.temperature,
        top_p=source.top_p,
        top_k=top_k,
        max_tokens=rollout.response_length,
        ignore_eos=rollout.ignore_eos,
        log_probs=log_probs,
        log_probs_from=log_probs_from,
    )


def vllm_engine_options(
    rollout: RolloutConfig, *, hf_overrides: Mapping[str, Any] | None = None, trust_remote_code: bool = False,
    lora_rank: int = 0, kv_cache_memory_bytes: int | None = None,
) -> VLLMEngineOptions:
    """The VLLMEngineOptions of the rollout node (the engine's context is `rollout.engine_max_model_len`).

    hf_overrides / trust_remote_code: from actor_rollout_ref.model (its override_config, resolved against the
    model's config, and trust_remote_code), so vLLM builds the model the training engine builds. lora_rank: the
    adapter the engine will serve (0: none; also 0 with actor_rollout_ref.model.lora.merge, merged weights).
    kv_cache_memory_bytes: one rank's KV cache (rollout/kv_cache.py; None: vLLM sizes it).
    """
    from verl_like.rollout.vllm import VLLMEngineOptions  # vLLM's module only when vLLM is the engine

    return VLLMEngineOptions(
        tensor_parallel_size=rollout.tensor_model_parallel_size,
        dtype=rollout.dtype,
        max_model_len=rollout.engine_max_model_len,
        gpu_memory_utilization=rollout.gpu_memory_utilization,
        kv_cache_memory_bytes=kv_cache_memory_bytes,
        enable_prefix_caching=rollout.enable_prefix_caching,
        load_format=rollout.load_format,
        seed=rollout.seed,
        max_num_seqs=rollout.max_num_seqs,
        max_num_batched_tokens=rollout.max_num_batched_tokens,
        enforce_eager=rollout.enforce_eager,
        sleep_level=rollout.sleep_level,
        hf_overrides=hf_overrides or {},
        trust_remote_code=trust_remote_code,
        max_lora_rank=lora_rank,
    )


def vllm_options(build: EngineBuild) -> VLLMEngineOptions:
    """The "vllm" entry's options: `vllm_engine_options` with the model node's overrides resolved against the
    policy's HF config (vLLM replaces a dict-valued field whole) and the KV cache rollout.kv_cache_tokens asks
    for on this process's device (rollout/kv_cache.py)."""
    from verl_like.engine.model_loading import resolved_overrides
    from verl_like.rollout.kv_cache import kv_cache_bytes, kv_cache_request
    from verl_like.utils.device import is_cuda_available

    overrides = resolved_overrides(build.hf_config, build.override_config) if build.override_config else {}
    rollout = build.rollout
    on_cuda = is_cuda_available()
    request = kv_cache_request(rollout, build.hf_config, build.model_path, "cuda" if on_cuda else "cpu")
    device_bytes = 0
    if on_cuda and request is not None and request.fit:
        import torch

        device_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    kv_bytes = kv_cache_bytes(request, rollout.gpu_memory_utilization, device_bytes,
                              rollout.tensor_model_parallel_size)
    return vllm_engine_options(rollout, hf_overrides=overrides, trust_remote_code=build.trust_remote_code,
                               lora_rank=build.lora_rank, kv_cache_memory_bytes=kv_bytes)


@dataclass(frozen=True)
class HFEngineOptions:
    """The "hf" entry's options: rollout.dtype ("auto": the checkpoint's), the policy's HF config (overrides
    applied) and actor_rollout_ref.model.trust_remote_code."""

    dtype: str
    hf_config: Any
    trust_remote_code: bool = False


def hf_options(build: EngineBuild) -> HFEngineOptions:
    return HFEngineOptions(build.rollout.dtype, build.hf_config, build.trust_remote_code)
