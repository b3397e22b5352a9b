"""use_fused_kernels: null (auto) is decided once when the config is loaded; explicit values win (issue #30 goal 2)."""

from __future__ import annotations

import json
import logging

import pytest

from verl_like.config import ConfigError, compose_config, load_config, to_typed
from verl_like.config.fused_kernels import FUSED_MODEL_TYPES, choose_fused_kernels, resolve_fused_kernels
from verl_like.config.model import ModelConfig, hf_model_type

SMOKE = ["+trainer=ci_smoke"]
CUDA = ["trainer.device=cuda"]
MEGATRON = ["actor_rollout_ref.actor.strategy=megatron"]


def _fused(overrides: list[str]) -> tuple[bool, bool]:
    arr = load_config(SMOKE + overrides, check_paths=False).actor_rollout_ref
    return arr.model.use_fused_kernels, arr.actor.use_fused_kernels


def _model_dir(tmp_path, model_type: str) -> str:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    return str(tmp_path)


@pytest.mark.parametrize("device, strategy, model_type, enabled, reason", [
    ("cuda", "fsdp2", "qwen2", True, "model_type 'qwen2'"),
    ("cuda", "fsdp2", "llama", True, "model_type 'llama'"),
    ("cpu", "fsdp2", "qwen2", False, "trainer.device=cpu"),
    ("cuda", "megatron", "qwen2", False, "actor.strategy=megatron"),
    ("cuda", "fsdp2", "gemma2", False, "model_type 'gemma2' is not one of"),
    ("cuda", "fsdp2", None, False, "unknown (no readable config.json)"),
])
def test_auto_is_on_exactly_for_cuda_fsdp2_and_a_supported_family(device, strategy, model_type, enabled, reason):
    choice = choose_fused_kernels(device, strategy, model_type)
    assert choice.enabled is enabled and reason in choice.reason


def test_the_default_is_auto_and_resolves_off_on_cpu():
    assert to_typed(compose_config(SMOKE)).actor_rollout_ref.model.use_fused_kernels is None
    assert _fused([]) == (False, False)


def test_auto_on_cuda_with_the_builtin_qwen2_model_is_on():
    assert _fused(CUDA) == (True, True)


def test_auto_on_cuda_with_megatron_is_off_without_an_error():
    assert _fused(CUDA + MEGATRON) == (False, False)


@pytest.mark.parametrize("model_type, enabled", [("qwen3", True), ("mistral", True), ("gpt2", False)])
def test_auto_reads_the_model_type_from_config_json(tmp_path, model_type, enabled):
    model_dir = _model_dir(tmp_path, model_type)
    assert _fused(CUDA + [f"actor_rollout_ref.model.path={model_dir}"]) == (enabled, enabled)


@pytest.mark.parametrize("value", [True, False])
def test_an_explicit_value_wins_over_auto(tmp_path, value):
    model_dir = _model_dir(tmp_path, "gpt2")  # auto would say false on it
    key = f"actor_rollout_ref.model.use_fused_kernels={str(value).lower()}"
    assert _fused(CUDA + [key, f"actor_rollout_ref.model.path={model_dir}"]) == (value, value)
    assert _fused(CUDA + ["actor_rollout_ref.model.use_fused_kernels=false"]) == (False, False)


def test_an_explicit_actor_value_wins_over_the_models_auto():
    assert _fused(CUDA + ["actor_rollout_ref.actor.use_fused_kernels=false"]) == (True, False)


@pytest.mark.parametrize("overrides, message", [
    (["actor_rollout_ref.model.use_fused_kernels=true"], "runs Triton kernels on CUDA, but trainer.device=cpu"),
    (CUDA + MEGATRON + ["actor_rollout_ref.model.use_fused_kernels=true"], "swaps layers of the HF model"),
])
def test_an_explicit_true_where_it_cannot_run_keeps_its_error(overrides, message):
    with pytest.raises((ConfigError, ValueError), match=message):
        load_config(SMOKE + overrides, check_paths=False)


def test_the_decision_is_logged_with_its_reason(caplog):
    with caplog.at_level(logging.INFO, logger="verl_like.config.fused_kernels"):
        load_config(SMOKE + CUDA + MEGATRON, check_paths=False)
    assert "use_fused_kernels=auto: false (actor.strategy=megatron" in caplog.text


def test_resolving_a_resolved_config_changes_nothing():
    config = load_config(SMOKE, check_paths=False)
    assert resolve_fused_kernels(config) is config


def test_a_hand_built_config_is_resolved_too():
    config = to_typed(compose_config(SMOKE + CUDA))
    assert resolve_fused_kernels(config).actor_rollout_ref.actor.use_fused_kernels is True


def test_the_builtin_model_on_an_image_task_is_not_a_supported_family():
    from verl_like.config.data import DataConfig
    from verl_like.data.synthetic import TASKS

    image_task = next(name for name, task in TASKS.items() if task.render is not None)
    assert hf_model_type(ModelConfig()) == "qwen2"
    assert hf_model_type(ModelConfig(), DataConfig(train_files=f"synthetic:{image_task}")) is None


def test_the_supported_families_are_those_the_fused_layers_swap():
    from verl_like.engine.fused_layers import MLP_CLASSES, RMSNORM_CLASSES

    prefixes = {"qwen2": "Qwen2", "qwen3": "Qwen3", "llama": "Llama", "mistral": "Mistral"}
    assert set(FUSED_MODEL_TYPES) == set(prefixes)
    for model_type in FUSED_MODEL_TYPES:
        assert f"{prefixes[model_type]}RMSNorm" in RMSNORM_CLASSES and f"{prefixes[model_type]}MLP" in MLP_CLASSES
