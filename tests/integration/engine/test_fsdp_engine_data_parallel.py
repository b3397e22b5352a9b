"""FSDP2 on 2 gloo ranks equals one float64 process on the full batch: outputs, loss, grad norm, updated weights.

Every micro-batching mode (none, fixed, dynamic token budget, packed, packed + dynamic + gradient checkpointing,
ranks with different row counts) and every model kind is checked against the same plain-loop reference.
"""

from __future__ import annotations

import math

import pytest
import torch

from engine_reference import make_batch, reference_outputs, reference_step
from engine_scenarios import ADAM_EPS, DATA_PARALLEL_SCENARIOS, LR, ROWS
from verl_like.engine.config import EngineConfig
from verl_like.engine.model_loading import load_model

FLOAT32_SCENARIOS = [name for name in DATA_PARALLEL_SCENARIOS if not name.startswith("bfloat16")]


@pytest.fixture(scope="module")
def batch(vocab_size):
    return make_batch(ROWS, vocab_size, seed=0)


@pytest.fixture(scope="module")
def references(tiny_model_dir, batch):
    """(kind, grad_clip) -> outputs before the step, loss, grad norm, weights after one AdamW step (float64)."""
    cache = {}

    def get(kind: str, grad_clip: float | None):
        if (kind, grad_clip) not in cache:
            model = load_model(EngineConfig(model_path=tiny_model_dir, model_kind=kind)).double()
            with torch.no_grad():
                outputs = reference_outputs(model, kind, batch)
            loss, grad_norm, weights = reference_step(model, kind, batch, LR, ADAM_EPS, grad_clip)
            cache[(kind, grad_clip)] = {"outputs": outputs, "loss": loss, "grad_norm": grad_norm, "weights": weights}
        return cache[(kind, grad_clip)]

    return get


def _gathered(results, key):
    return torch.cat([result["outputs"][key] for result in results])


def _reference_for(name, references):
    kind, overrides, _ = DATA_PARALLEL_SCENARIOS[name]
    return kind, references(kind, overrides.get("grad_clip", 1.0))


@pytest.mark.parametrize("name", FLOAT32_SCENARIOS)
def test_two_ranks_match_the_full_batch_reference(engine_runs, references, name):
    _assert_matches(engine_runs.get(name), _reference_for(name, references)[1])


def test_the_chunked_lm_head_on_two_ranks_matches_the_full_batch_reference(engine_runs, references, tied_model_dir,
                                                                          batch):
    """FSDP2 (gloo) with the head's log-probs from hidden states, chunk by chunk: outputs, loss, grad norm and
    updated weights equal the float64 whole-logits reference, for an untied and a tied (shared-weight) head."""
    runs = engine_runs.get("chunked_head_packed")
    assert all(run["chunked_calls"] > 0 for run in runs)
    _assert_matches([run["untied"] for run in runs], references("causal_lm", 1.0))
    model = load_model(EngineConfig(model_path=tied_model_dir)).double()
    with torch.no_grad():
        outputs = reference_outputs(model, "causal_lm", batch)
    loss, grad_norm, weights = reference_step(model, "causal_lm", batch, LR, ADAM_EPS, 1.0)
    _assert_matches([run["tied"] for run in runs],
                    {"outputs": outputs, "loss": loss, "grad_norm": grad_norm, "weights": weights})


def _assert_matches(results, reference):
    for key, expected in reference["outputs"].items():
        if key == "entropy" and "entropy" not in results[0]["outputs"]:
            continue
        torch.testing.assert_close(_gathered(results, key), expected.float(), atol=1e-5, rtol=1e-5)
    for result in results:  # loss and grad norm are global: the same on both ranks
        assert result["loss"] == pytest.approx(reference["loss"], rel=1e-5, abs=1e-7)
        assert result["grad_norm"] == pytest.approx(reference["grad_norm"], rel=1e-5)
    assert results[0]["num_micro_batches"] == results[1]["num_micro_batches"]
    weights = results[0]["weights"]
    assert weights.keys() == reference["weights"].keys()
    for param_name, expected in reference["weights"].items():
        torch.testing.assert_close(weights[param_name], expected.float(), atol=1e-5, rtol=0, msg=param_name)


def test_the_weights_actually_moved(engine_runs, tiny_model_dir):
    initial = load_model(EngineConfig(model_path=tiny_model_dir)).state_dict()
    weights = engine_runs.get("padded_micro_batches")[0]["weights"]
    moved = max(float((weights[name] - initial[name]).abs().max()) for name in weights)
    assert moved == pytest.approx(LR, rel=0.05)  # Adam's first step moves each weight by about lr


def test_lr_scale_steps_at_the_scaled_rate_and_leaves_the_schedule(engine_runs, tiny_model_dir, batch):
    model = load_model(EngineConfig(model_path=tiny_model_dir)).double()
    _, grad_norm, expected_weights = reference_step(model, "causal_lm", batch, LR * 0.5, ADAM_EPS, grad_clip=1.0)
    results = engine_runs.get("scaled_lr_step")
    for result in results:
        assert result["grad_norm"] == pytest.approx(grad_norm, rel=1e-5)
        assert result["lr_after"] == LR  # only that step was scaled
        assert result["global_step"] == 1  # the rejected scales took no step
        for scale, message in result["refusals"].items():
            assert message == f"FSDPEngine.optimizer_step: lr_scale={scale} must lie in (0, 1]"
    for param_name, expected in expected_weights.items():
        torch.testing.assert_close(results[0]["weights"][param_name], expected.float(), atol=1e-5, rtol=0,
                                   msg=param_name)


def test_grad_clip_none_reports_the_norm_without_clipping(engine_runs):
    # The same data with grad_clip=1.0 (the other scenarios) must have clipped a norm above 1.
    assert engine_runs.get("padded_no_micro_batches")[0]["grad_norm"] > 1.0


@pytest.mark.parametrize(
    "name, expected",
    [("padded_no_micro_batches", [1, 1]), ("padded_micro_batches", [4, 4]), ("uneven_rows", [3, 3])],
)
def test_every_rank_runs_the_same_number_of_micro_batches(engine_runs, name, expected):
    assert [result["num_micro_batches"] for result in engine_runs.get(name)] == expected


@pytest.mark.parametrize("name, budget", [("padded_dynamic", 20), ("packed_dynamic_checkpointed", 24)])
def test_dynamic_batching_needs_at_least_the_token_bound(engine_runs, batch, name, budget):
    results = engine_runs.get(name)
    counts = [result["num_micro_batches"] for result in results]
    tokens_per_rank = [int(batch["attention_mask"][rows].sum()) for rows in (slice(0, 4), slice(4, None))]
    assert counts[0] == counts[1] >= max(math.ceil(tokens / budget) for tokens in tokens_per_rank)
    assert counts[0] > 1  # the budget really split the batch


def test_loss_fn_metrics_cover_every_token_once(engine_runs, batch):
    results = engine_runs.get("packed_dynamic_checkpointed")
    counted = sum(sum(result["metrics"]["tokens"]) for result in results)
    assert counted == int(batch["response_mask"].sum())
    assert all(len(result["metrics"]["tokens"]) == result["num_micro_batches"] for result in results)


def test_packed_equals_padded_log_probs(engine_runs):
    padded = engine_runs.get("padded_micro_batches")
    packed = engine_runs.get("packed_micro_batches")
    for key in ("log_probs", "entropy"):
        torch.testing.assert_close(_gathered(packed, key), _gathered(padded, key), atol=1e-5, rtol=1e-5)


def test_parameter_shards_are_dim0_slices_of_the_full_weights(engine_runs):
    results = engine_runs.get("padded_no_micro_batches")
    weights = results[0]["weights"]
    for name, full in weights.items():
        shards = [result["shards"][name] for result in results]
        assert shards[0].shape[0] == math.ceil(full.shape[0] / 2)
        torch.testing.assert_close(torch.cat(shards), full, atol=0, rtol=0)


@pytest.mark.parametrize("name", ["bfloat16_params", "bfloat16_compute_float32_reduce"])
def test_bfloat16_runs_stay_close_to_the_float64_reference(engine_runs, references, name):
    results = engine_runs.get(name)
    reference = references("causal_lm", 1.0)
    torch.testing.assert_close(
        _gathered(results, "log_probs"), reference["outputs"]["log_probs"].float(), atol=5e-2, rtol=2e-2
    )
    for result in results:
        assert result["loss"] == pytest.approx(reference["loss"], rel=2e-2)
        assert result["grad_norm"] == pytest.approx(reference["grad_norm"], rel=5e-2)
    expected_dtype = torch.bfloat16 if name == "bfloat16_params" else torch.float32
    assert {w.dtype for w in results[0]["weights"].values()} == {expected_dtype}
    for param_name, expected in reference["weights"].items():
        torch.testing.assert_close(
            results[0]["weights"][param_name].float(), expected.float(), atol=1e-2, rtol=1e-2, msg=param_name
        )
