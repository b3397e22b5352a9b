"""Running megatron-core on CPU over gloo: the process-wide shims, applied only when there is no CUDA device.

megatron-core has no CPU path: it hard-codes "cuda" in a few places. What this module changes (each counts its
hits in `SHIM_HITS`, so a test sees which spots a train step reaches and an upgrade that adds a new one shows):
  "current_device": `torch.cuda.current_device()` returns "cpu" (pipeline receive buffers, the DDP grad buffer,
    RoPE's inv_freq, the global memory buffer, TP layer init);
  "cuda_device_arg": inside `cpu_mode()`, a `device="cuda"` argument becomes "cpu" and `Tensor.cuda()` returns
    the tensor (the token count of every schedule, the fp32 optimizer's scale, grad-norm code, tied embeddings);
  "synchronize": `torch.cuda.synchronize` is a no-op (pipeline p2p with batch_p2p_comm);
  "current_stream": `torch.cuda.current_stream` returns a stream whose methods do nothing (0.19's DDP grad sync;
    not reached by 0.16.1);
  "rng_tracker": Megatron's CUDA RNG tracker is replaced by one that forks the CPU generator.
The process group itself needs no shim: `init_process_group("gloo")`, and parallel_state's sub-groups inherit it.
Megatron's bf16 optimizer type-checks `torch.cuda.*Tensor`, so CPU runs train in float32.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

SHIM_HITS: Counter[str] = Counter()
_applied = False


def _is_cuda(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, int) and not isinstance(device, bool)


class _CudaArgumentsToCpu(TorchFunctionMode):
    """Rewrites CUDA device arguments to the CPU and makes `Tensor.cuda()` the identity."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            SHIM_HITS["cuda_device_arg"] += 1
            return args[0]
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            SHIM_HITS["cuda_device_arg"] += 1
            kwargs = dict(kwargs, device="cpu")
        return func(*args, **kwargs)


class _IdleStream:
    """Stands in for a CUDA stream on CPU: every method is a no-op."""

    def __getattr__(self, name: str):
        return lambda *args, **kwargs: None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _current_device() -> str:
    SHIM_HITS["current_device"] += 1
    return "cpu"


def _synchronize(device: Any = None) -> None:
    SHIM_HITS["synchronize"] += 1


def _current_stream(device: Any = None) -> _IdleStream:
    SHIM_HITS["current_stream"] += 1
    return _IdleStream()


def _install_cpu_rng_tracker() -> None:
    from megatron.core.tensor_parallel import random as mp_random

    class CpuRNGStatesTracker(mp_random.CudaRNGStatesTracker):
        """Megatron's named RNG states, kept as CPU generator states."""

        def add(self, name: str, seed: int) -> None:
            SHIM_HITS["rng_tracker"] += 1
            if name in self.states_:
                raise RuntimeError(f"rng state {name} already exists")
            original = torch.get_rng_state()
            torch.manual_seed(seed)
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(original)
            self.seeds_.add(seed)

        @contextlib.contextmanager
        def fork(self, name: str = mp_random._MODEL_PARALLEL_RNG_TRACKER_NAME):
            SHIM_HITS["rng_tracker"] += 1
            if name not in self.states_:
                raise RuntimeError(f"rng state {name} is not added")
            original = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(original)

    mp_random._CUDA_RNG_STATE_TRACKER = CpuRNGStatesTracker()
    mp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True


def apply_cpu_shims() -> None:
    """Installs the process-wide shims (idempotent). Call only in a process without CUDA."""
    global _applied
    if _applied:
        return
    if torch.cuda.is_available():
        raise RuntimeError("apply_cpu_shims: this process has a CUDA device; the CPU shims would break it")
    torch.cuda.current_device = _current_device
    torch.cuda.synchronize = _synchronize
    torch.cuda.current_stream = _current_stream
    _install_cpu_rng_tracker()
    _applied = True


def seed_model_parallel_rng(seed: int, tp_rank: int) -> None:
    """Megatron's model-parallel RNG states (as `model_parallel_cuda_manual_seed` adds them) in the CPU tracker."""
    from megatron.core.tensor_parallel import random as mp_random

    tracker = mp_random._CUDA_RNG_STATE_TRACKER
    tracker.reset()
    tracker.add(mp_random._DATA_PARALLEL_RNG_TRACKER_NAME, seed)
    tracker.add(mp_random._MODEL_PARALLEL_RNG_TRACKER_NAME, seed + 2718 + tp_rank)


@contextlib.contextmanager
def cpu_mode(enabled: bool) -> Iterator[None]:
    """While active (and `enabled`), CUDA device arguments land on the CPU."""
    if not enabled:
        yield
        return
    with _CudaArgumentsToCpu():
        yield
