"""ReferencePolicy's temperature plumbing (its log-probs vs the actor's run on Ray in test_actor_update.py)."""

from __future__ import annotations

import pytest
import torch

from verl_like.protocol import DataProto
from verl_like.workers.reference import ReferencePolicy


class _TemperatureEcho:
    """A stand-in engine whose log-probs are the temperature it was asked for."""

    def forward(self, batch: DataProto, temperature: float = 1.0, calculate_entropy: bool = False) -> DataProto:
        return DataProto.from_dict(tensors={"log_probs": torch.full((len(batch), 2), temperature)})


def _batch(**meta) -> DataProto:
    return DataProto.from_dict(tensors={"input_ids": torch.zeros(3, 4, dtype=torch.long)}, meta_info=meta)


def test_temperature_comes_from_the_argument_or_the_batch():
    reference = ReferencePolicy(_TemperatureEcho())
    from_meta = reference.compute_ref_log_prob(_batch(temperature=0.7))
    assert list(from_meta.batch.keys()) == ["ref_log_probs"]
    assert torch.all(from_meta.batch["ref_log_probs"] == 0.7)
    explicit = reference.compute_ref_log_prob(_batch(temperature=0.7), temperature=1.3)
    assert torch.all(explicit.batch["ref_log_probs"] == 1.3)


def test_missing_temperature_names_the_fix():
    with pytest.raises(KeyError, match=r"pass temperature= or set batch\.meta_info\['temperature'\]"):
        ReferencePolicy(_TemperatureEcho()).compute_ref_log_prob(_batch())
