"""trainer.device=auto is resolved once, before any check reads it (issue #31, item 8)."""

import pytest

import verl_like.utils.device as device
from verl_like.config.loader import load_config
from verl_like.trainer.preflight import PreflightError, check_devices

FUSED = ["trainer.device=auto", "actor_rollout_ref.model.use_fused_kernels=true"]


def test_auto_on_a_gpu_host_is_cuda_before_validation(monkeypatch):
    monkeypatch.setattr(device, "is_cuda_available", lambda: True)
    config = load_config(FUSED, check_paths=False)  # use_fused_kernels needs cuda: auto counts as cuda here
    assert config.trainer.device == "cuda" and config.actor_rollout_ref.actor.use_fused_kernels


def test_auto_on_a_cpu_host_is_cpu_and_fused_kernels_are_refused_naming_it(monkeypatch):
    monkeypatch.setattr(device, "is_cuda_available", lambda: False)
    with pytest.raises(ValueError, match="trainer.device=cpu"):
        load_config(FUSED, check_paths=False)


def test_preflight_counts_gpus_for_auto_on_a_gpu_host(monkeypatch):
    monkeypatch.setattr(device, "is_cuda_available", lambda: True)
    config = load_config(["trainer.device=auto", "trainer.n_gpus_per_node=4"], check_paths=False)
    with pytest.raises(PreflightError, match="ask 4 GPUs but the local cluster has 2"):
        check_devices(config, cuda_devices=2)
