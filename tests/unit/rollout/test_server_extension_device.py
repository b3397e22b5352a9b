"""The gloo weight-transfer engine (inside a vLLM server) hands the loader tensors on the model's device.

gloo fills host memory; on a GPU server each bucket must reach the device once, before the loader (and vLLM's
layerwise reload, which keeps the loaded tensors until a layer is complete) sees it. The `meta` device stands in
for CUDA here: a tensor still on the CPU would show."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from verl_like.rollout.server_extension import GlooUpdateInfo, GlooWeightTransferEngine  # noqa: E402


class _Work:
    def wait(self) -> None:
        pass


class _Group:
    """Stands in for the gloo group: a broadcast fills the buffer with 0, 1, 2, ..."""

    def broadcast(self, tensor: torch.Tensor, src: int) -> _Work:
        tensor.copy_(torch.arange(tensor.numel(), dtype=tensor.dtype))
        return _Work()


class _Model:
    def __init__(self) -> None:
        self.loaded: list[tuple[str, torch.Tensor]] = []

    def load_weights(self, weights) -> None:
        self.loaded.extend(weights)


def _engine(device: str) -> GlooWeightTransferEngine:
    engine = GlooWeightTransferEngine.__new__(GlooWeightTransferEngine)  # no vLLM config needed for the receive
    engine.device, engine.model, engine.group = torch.device(device), _Model(), _Group()
    return engine


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_received_bucket_is_split_onto_the_model_device(device):
    engine = _engine(device)
    engine.receive_weights(GlooUpdateInfo(names=["a", "b"], shapes=[[2, 3], [4]], dtype_name="bfloat16"))
    (name_a, a), (name_b, b) = engine.model.loaded
    assert (name_a, tuple(a.shape), name_b, tuple(b.shape)) == ("a", (2, 3), "b", (4,))
    assert a.device.type == b.device.type == device and a.dtype == b.dtype == torch.bfloat16
    if device == "cpu":
        assert a.flatten().tolist() == [0, 1, 2, 3, 4, 5] and b.tolist() == [6, 7, 8, 9]
