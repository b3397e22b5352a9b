"""The scoped CPU shim (verl_like.engine.megatron.cpu_support.cpu_mode): CUDA device arguments land on the CPU.

The process-wide shims (torch.cuda.current_device and friends) are exercised by the 4-rank engine test, which
asserts which of them a train step reaches; they are not applied in this (shared) unit-test process.
"""

from __future__ import annotations

import pytest
import torch

from verl_like.engine.megatron import cpu_support


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only rewrite")
def test_cuda_device_arguments_land_on_the_cpu_and_are_counted():
    cpu_support.SHIM_HITS.clear()
    with cpu_support.cpu_mode(True):
        made = torch.zeros(2, device="cuda")
        indexed = torch.ones(1, device=torch.device("cuda", 0))
        moved = made.cuda()
    assert made.device.type == indexed.device.type == moved.device.type == "cpu"
    assert moved is made
    assert cpu_support.SHIM_HITS["cuda_device_arg"] == 3


def test_the_rewrite_is_scoped_and_can_be_disabled():
    cpu_support.SHIM_HITS.clear()
    with cpu_support.cpu_mode(False):
        torch.zeros(1, device="cpu")
    with cpu_support.cpu_mode(True):
        torch.zeros(1, device="cpu")  # already CPU: nothing to rewrite
    assert cpu_support.SHIM_HITS["cuda_device_arg"] == 0
    if not torch.cuda.is_available():
        with pytest.raises((RuntimeError, AssertionError)):
            torch.zeros(1, device="cuda")  # outside cpu_mode torch still refuses
