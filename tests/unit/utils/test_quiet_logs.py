"""vLLM's harmless per-step warnings are hidden at the default level and shown again at trainer.log_level=INFO."""

from __future__ import annotations

import logging

import pytest

from verl_like.config.errors import ConfigError
from verl_like.config.loader import load_config
from verl_like.utils.quiet_logs import HARMLESS_REPEATS, install_noise_filters, log_level_env

LAYERWISE = HARMLESS_REPEATS[0][0]


def _emitted(caplog, level: str, layer: str) -> list[str]:
    logger = logging.getLogger(LAYERWISE)
    logger.filters.clear()
    install_noise_filters(level)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LAYERWISE):
        logger.warning("%s: Failed to load weights", layer)
    logger.filters.clear()
    return [r.getMessage() for r in caplog.records]


def test_rotary_reload_warning_is_hidden_by_default_and_shown_at_info(caplog):
    assert _emitted(caplog, "WARNING", "RotaryEmbedding") == []
    assert _emitted(caplog, "INFO", "RotaryEmbedding") == ["RotaryEmbedding: Failed to load weights"]


def test_a_real_layer_that_failed_to_load_still_warns(caplog):
    assert _emitted(caplog, "WARNING", "QKVParallelLinear") == ["QKVParallelLinear: Failed to load weights"]


def test_trainer_log_level_reaches_vllm_and_ray_in_the_workers():
    assert log_level_env("INFO")["VLLM_LOGGING_LEVEL"] == "INFO"
    assert load_config(["trainer.log_level=INFO"], check_paths=False).trainer.log_level == "INFO"
    with pytest.raises(ConfigError, match="trainer.log_level='LOUD' must be one of"):
        load_config(["trainer.log_level=LOUD"], check_paths=False)


def test_jit_monitor_is_quiet_about_our_training_kernels_only(caplog):
    name = "vllm.utils.jit_monitor"
    message = "%s %s during inference: %s%s. This causes a latency spike"
    logger = logging.getLogger(name)
    logger.filters.clear()
    install_noise_filters("WARNING")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=name):
        logger.warning(message, "Triton kernel", "JIT compilation", "_kernels.<locals>.token_log_probs_forward", "")
        logger.warning(message, "Triton kernel", "JIT compilation", "_topk_log_softmax_kernel", "")
    logger.filters.clear()
    assert [r.getMessage().split(": ")[1].split(".")[0] for r in caplog.records] == ["_topk_log_softmax_kernel"]
