"""Engine controls on 2 ranks: LR schedule, non-finite gradients, offload on CPU, errors raised on every rank."""

import math

import pytest


def test_cosine_schedule_with_warmup_drives_the_optimizer_lr(engine_runs):
    # lr 1e-3, warmup 2, total 5, min_lr_ratio 0.1; written out by hand.
    cosine = [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * k / 3)) for k in range(4)]
    expected = [1e-3 * f for f in [0.5, 1.0, *cosine]]
    for result in engine_runs.get("lr_schedule"):
        assert result["lrs"] == pytest.approx(expected, rel=1e-12)
        assert result["global_step"] == 6


def test_non_finite_gradient_skips_the_update_but_counts_the_step(engine_runs):
    for result in engine_runs.get("non_finite_gradient"):
        assert math.isnan(result["grad_norm"])
        assert result["unchanged"]
        assert result["global_step"] == 1


def test_offload_refuses_compute_until_onload_and_then_changes_nothing(engine_runs):
    for result in engine_runs.get("offload_round_trip"):
        assert result["refused"] == "FSDPEngine.forward: parameters are offloaded to CPU; call onload() first"
        assert result["equal"]
        assert math.isfinite(result["grad_norm_after_onload"]) and result["grad_norm_after_onload"] > 0


def test_a_rank_with_too_few_rows_fails_every_rank_with_the_same_error(engine_runs):
    errors = [result["too_few_rows"] for result in engine_runs.get("planning_errors")]
    assert errors[0] == errors[1]
    assert errors[0].startswith("ValueError: a data-parallel rank has 2 rows but another needs 6 micro-batches")


def test_a_sequence_over_budget_on_one_rank_fails_every_rank(engine_runs):
    rank0, rank1 = (result["over_budget"] for result in engine_runs.get("planning_errors"))
    assert rank1.startswith("ValueError:") and "raise max_tokens_per_rank to at least 11" in rank1
    assert rank0.startswith("RuntimeError: another data-parallel rank could not plan its micro-batches")


def test_ranks_size_the_token_budget_from_their_own_free_memory_and_agree_on_the_smallest(engine_runs):
    results = engine_runs.get("token_budget_sizing")
    assert [r["solo"] for r in results] == [8192, 16384]  # what each rank's own free memory allows
    for result in results:
        assert result["agreed"] == {"update": 8192} and result["max_tokens"] == 8192
        assert result["num_micro_batches"] == 1
    # Each rank counts its own shards: together, every parameter once.
    assert sum(r["trainable_local"] for r in results) == results[0]["parameters"]
