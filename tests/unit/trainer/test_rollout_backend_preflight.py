"""A run that needs vLLM where it cannot be imported stops before Ray with the install command for its device."""

from __future__ import annotations

import importlib.util

import pytest

from verl_like.config.rollout_backends import INSTALL_CPU, INSTALL_GPU
from verl_like.trainer.preflight import PreflightError, check_rollout_backend


def test_missing_vllm_names_the_install_command_for_the_device(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(PreflightError) as cpu:
        check_rollout_backend("vllm", "cpu")
    assert INSTALL_CPU in str(cpu.value) and "rollout.name=hf" in str(cpu.value)
    with pytest.raises(PreflightError) as gpu:
        check_rollout_backend("vllm", "cuda")
    assert INSTALL_GPU in str(gpu.value)
    check_rollout_backend("hf", "cpu")  # the HF rollout needs no vLLM
