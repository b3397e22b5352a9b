"""FullTensorTransport sends a frozen vision tower (the engine's static weights) with the first sync only."""

from __future__ import annotations

import torch

from verl_like.resharding.transports.full import FullTensorTransport


class Engine:
    """A TrainEngine's full-tensor surface: parameters a, tower and b; the tower is static."""

    dp_size = 1

    def __init__(self) -> None:
        self.tensors = {"a": torch.ones(2), "tower": torch.ones(3), "b": torch.ones(4)}
        self.gathered: list[str] = []

    def static_weight_names(self) -> frozenset[str]:
        return frozenset({"tower"})

    def full_state_iterator_skipping(self, skip):
        for name, tensor in self.tensors.items():
            if name not in skip:
                self.gathered.append(name)
                yield name, tensor


def loads(transport: FullTensorTransport, sends: int) -> list[list[str]]:
    seen: list[list[str]] = []
    transport.load = lambda stream: seen.append([name for name, _ in stream])
    for version in range(sends):
        transport.send(version)
    return seen


def test_static_weights_go_with_the_first_send_only_and_are_not_gathered_again():
    engine = Engine()
    transport = FullTensorTransport(engine, load=None, send_static_once=True)
    assert loads(transport, 3) == [["a", "tower", "b"], ["a", "b"], ["a", "b"]]
    assert engine.gathered.count("tower") == 1
    assert transport.send(3).model_bytes == 4 * (2 + 4)  # float32 bytes of a and b


def test_without_send_static_once_every_send_carries_everything():
    transport = FullTensorTransport(Engine(), load=None)
    assert loads(transport, 2) == [["a", "tower", "b"], ["a", "tower", "b"]]
