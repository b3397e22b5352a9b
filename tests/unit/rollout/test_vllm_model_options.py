"""actor_rollout_ref.model's override_config / trust_remote_code reach vLLM: through
rollout/from_config.vllm_engine_options, build_llm_kwargs and vLLM's own model config (built from the kwargs
without starting an engine)."""

from __future__ import annotations

import dataclasses

import pytest

from verl_like.config.rollout import RolloutConfig
from verl_like.engine.model_loading import load_hf_config, resolved_overrides
from verl_like.models.tiny import build_tiny_model
from verl_like.rollout.from_config import vllm_engine_options
from verl_like.rollout.vllm import VLLMEngineOptions, build_llm_kwargs


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("vllm_model_options") / "tiny"))


def test_options_default_to_no_overrides_and_no_remote_code():
    kwargs = build_llm_kwargs("/m", VLLMEngineOptions())
    assert kwargs["trust_remote_code"] is False and "hf_overrides" not in kwargs


def test_rollout_config_passes_overrides_and_trust_remote_code():
    options = vllm_engine_options(RolloutConfig(), hf_overrides={"use_cache": False, "b": 1}, trust_remote_code=True)
    assert options.hf_overrides == (("b", 1), ("use_cache", False)) and options.trust_remote_code
    assert dataclasses.replace(options, seed=1).hf_overrides == options.hf_overrides
    kwargs = build_llm_kwargs("/m", options)
    assert kwargs["hf_overrides"] == {"b": 1, "use_cache": False} and kwargs["trust_remote_code"] is True


def test_vllm_model_config_sees_the_training_engines_overrides(model_dir):
    from vllm.engine.arg_utils import EngineArgs

    overrides = {"max_position_embeddings": 4096, "rope_parameters": {"rope_theta": 20000.0}}
    # What the FSDP engine builds; vLLM replaces dict-valued fields whole, so it gets the merged dict.
    engine_config = load_hf_config(model_dir, override_config=overrides)
    options = VLLMEngineOptions(hf_overrides=resolved_overrides(engine_config, overrides), trust_remote_code=True)
    kwargs = build_llm_kwargs(model_dir, options)
    unknown = [key for key in kwargs if key not in EngineArgs.__dataclass_fields__]
    assert not unknown, f"build_llm_kwargs passes arguments vLLM's EngineArgs lacks: {unknown}"
    model_config = EngineArgs(**kwargs).create_model_config()
    assert model_config.trust_remote_code is True
    assert model_config.hf_config.max_position_embeddings == 4096 == model_config.max_model_len
    assert model_config.hf_config.rope_parameters == engine_config.rope_parameters
    assert engine_config.rope_parameters == {"rope_theta": 20000.0, "rope_type": "default"}
