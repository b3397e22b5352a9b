"""rollout/sync_check.py without an engine: the probe is fixed, the tolerance follows the less precise dtype, and a
gap above it fails naming the engine and both versions."""

from __future__ import annotations

import math

import pytest
import torch

from verl_like.rollout import sync_check


def test_probe_is_the_same_every_time_and_in_the_vocabulary():
    ids = sync_check.probe_token_ids(50)
    assert ids == sync_check.probe_token_ids(50) and len(ids) == sync_check.PROBE_LENGTH
    assert all(0 <= i < 50 for i in ids)
    batch = sync_check.probe_batch(ids).batch
    assert batch["input_ids"].tolist() == [ids]
    assert batch["responses"].tolist() == [ids[sync_check.PROBE_SCORED_FROM:]]
    assert batch["position_ids"].tolist() == [list(range(len(ids)))]


def test_tolerance_is_the_least_precise_sides():
    assert sync_check.tolerance([torch.float32, torch.float32]) == 1e-3
    assert sync_check.tolerance([torch.bfloat16, torch.float32]) == 1e-1
    assert sync_check.tolerance([None, torch.float16]) == 5e-2
    assert sync_check.tolerance([None]) == 1e-3
    assert sync_check.tolerance([torch.bfloat16], override=0.02) == 0.02


def test_a_gap_within_the_tolerance_passes_with_its_metrics():
    result = sync_check.compare([-1.0, -2.0], torch.tensor([-1.0005, -2.0], dtype=torch.float64), 1e-3, "engine X", 3, 3)
    assert result.metrics() == {"rollout/sync_check_gap": pytest.approx(2.5e-4),
                                "rollout/sync_check_gap_max": pytest.approx(5e-4)}


@pytest.mark.parametrize("served", [[-1.5, -2.0], [math.nan, -2.0]])
def test_a_gap_above_the_tolerance_fails_naming_the_engine_and_both_versions(served):
    with pytest.raises(sync_check.SyncCheckError) as excinfo:
        sync_check.compare(served, torch.tensor([-1.0, -2.0]), 1e-3, "server 0 (http://h:1)", 4, 5)
    message = str(excinfo.value)
    assert "server 0 (http://h:1) holding version 4 does not serve the trainer's policy of version 5" in message


def test_probe_fits_the_engine_context_limit():
    """A prompt-log-prob request needs a token of room: the probe shrinks to max_model_len - 1, scored from its
    first third; unlimited engines get the fixed probe."""
    ids, start = sync_check.probe(100)
    assert (len(ids), start) == (sync_check.PROBE_LENGTH, sync_check.PROBE_SCORED_FROM)
    ids, start = sync_check.probe(100, max_model_len=24)
    assert (len(ids), start) == (23, 7)
    assert ids == sync_check.probe_token_ids(100, 23)
    ids, start = sync_check.probe(100, max_model_len=4)
    assert (len(ids), start) == (3, 1)
