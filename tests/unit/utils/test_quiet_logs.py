"""vLLM's harmless per-step warnings are hidden at the default level and shown again at trainer.log_level=INFO."""

from __future__ import annotations

import logging

import pytest

from verl_like.config.errors import ConfigError
from verl_like.config.loader import load_config
import warnings

from verl_like.utils.quiet_logs import HARMLESS_REPEATS, STARTUP_NOTICES, install_noise_filters, log_level_env

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
    assert log_level_env("INFO")["RAY_BACKEND_LOG_LEVEL"] == "info"
    assert log_level_env("INFO")["TORCH_CPP_LOG_LEVEL"] == "INFO"
    # The default leaves Ray's backend level alone (setting it prints a line in every Ray process) and keeps
    # torch's C++ warnings (vLLM CPU's NUMA-binding notice) below ERROR.
    assert "RAY_BACKEND_LOG_LEVEL" not in log_level_env("WARNING")
    assert log_level_env("WARNING")["TORCH_CPP_LOG_LEVEL"] == "ERROR"
    assert log_level_env("WARNING")["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    assert "HF_HUB_DISABLE_PROGRESS_BARS" not in log_level_env("INFO")
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


@pytest.mark.parametrize("name,fragment", [(n, f) for n, f, _ in STARTUP_NOTICES])
def test_start_up_notices_are_hidden_by_default_and_shown_at_info(caplog, name, fragment):
    logger = logging.getLogger(name)
    shown = {}
    for level in ("WARNING", "INFO"):
        logger.filters.clear()
        install_noise_filters(level)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=name):
            logger.warning(f"vLLM says: {fragment} (%s)", "detail")
        shown[level] = [r.getMessage() for r in caplog.records]
    logger.filters.clear()
    assert shown == {"WARNING": [], "INFO": [f"vLLM says: {fragment} (detail)"]}


def test_other_warnings_of_the_same_loggers_still_show(caplog):
    name = STARTUP_NOTICES[0][0]
    logger = logging.getLogger(name)
    logger.filters.clear()
    install_noise_filters("WARNING")
    with caplog.at_level(logging.WARNING, logger=name):
        logger.warning("Node %s is not in available memory nodes %s.", 1, [0])
    logger.filters.clear()
    assert [r.getMessage() for r in caplog.records] == ["Node 1 is not in available memory nodes [0]."]


def test_torch_reduce_op_future_warning_from_vllm_import_is_ignored_by_default():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        install_noise_filters("WARNING")
        warnings.warn("`torch.distributed.reduce_op` is deprecated, please use ReduceOp", FutureWarning)
        warnings.warn("something else is deprecated", FutureWarning)
    assert [str(w.message) for w in seen] == ["something else is deprecated"]
