"""Device decisions: which CUDA device a rank uses, and the backend/resource names (device counts patched)."""

from __future__ import annotations

import pytest
import torch

from verl_like.utils import device


@pytest.mark.parametrize("local_rank", [0, 1, 5])
def test_a_ray_gpu_worker_that_sees_one_device_uses_index_zero(monkeypatch, local_rank):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert device.visible_device_index(local_rank) == 0


def test_with_every_node_device_visible_the_local_rank_is_the_index(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert [device.visible_device_index(r) for r in range(4)] == [0, 1, 2, 3]


def test_a_local_rank_without_a_device_names_the_visible_devices(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,4")
    with pytest.raises(RuntimeError, match=r"local rank 2 has no CUDA device.*'3,4'"):
        device.visible_device_index(2)


def test_force_cpu_hides_gpus(monkeypatch):
    monkeypatch.setenv("VERL_LIKE_FORCE_CPU", "1")
    assert not device.is_cuda_available()
    assert device.get_device_name() == "cpu" and device.get_dist_backend() == "gloo"
    assert device.resolve_device("auto") == "cpu" and device.resolve_device("cuda") == "cuda"


def test_ray_resource_names():
    assert device.ray_resource_name("cuda") == "GPU" and device.ray_resource_name("cpu") == "CPU"
    with pytest.raises(ValueError, match="device='tpu' is not supported"):
        device.ray_resource_name("tpu")


def test_host_memory_metric_sees_a_quarter_gib_the_process_touches():
    before = device.peak_memory_metrics()["perf/cpu_memory_used_gb"]
    block = torch.ones(64 * 1024 * 1024)  # 256 MiB of float32, every page written
    after = device.peak_memory_metrics("perf/critic")["perf/critic/cpu_memory_used_gb"]
    assert after - before > 0.2, (before, after)
    del block


def test_cuda_memory_metrics_report_the_allocators_peaks_and_reset_them(monkeypatch):
    resets = []
    monkeypatch.setattr(device, "is_cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 3 * 1024 ** 3)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda: 4.5 * 1024 ** 3)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: resets.append(1))
    metrics = device.peak_memory_metrics()
    assert metrics["perf/max_memory_allocated_gb"] == 3.0 and metrics["perf/max_memory_reserved_gb"] == 4.5
    assert resets == [1]  # the next call reports its own interval
