"""Checkpoints: save -> load into a fresh engine -> one more step equals the run without the interruption, exactly."""

import math


def test_resumed_step_equals_the_uninterrupted_run_exactly(engine_runs):
    for result in engine_runs.get("checkpoint_resume"):
        assert result["weights_equal"]
        assert result["norm_resumed"] == result["norm_straight"]


def test_step_schedule_and_rng_are_restored(engine_runs):
    # cosine, warmup 1, total 4, lr 1e-3: the third step (index 2) uses 0.5 * (1 + cos(pi / 3)) * lr.
    for result in engine_runs.get("checkpoint_resume"):
        assert result["step_after_load"] == 2
        assert math.isclose(result["lr_after_load"], 1e-3 * 0.5 * (1 + math.cos(math.pi / 3)), rel_tol=1e-12)
        assert result["rng_restored"]


def test_checkpoint_directory_is_complete_and_no_staging_is_left(engine_runs):
    result = engine_runs.get("checkpoint_resume")[0]
    assert "checkpoint" in result["entries"]
    assert not [entry for entry in result["entries"] if entry.startswith(".checkpoint")]
    assert {"extra_state_rank0.pt", "extra_state_rank1.pt", ".metadata"} <= set(result["files"])
    assert any(name.endswith(".distcp") for name in result["files"])


def test_loading_a_missing_checkpoint_names_the_directory(engine_runs):
    for result in engine_runs.get("checkpoint_resume"):
        assert "never_written is not a finished engine checkpoint" in result["missing_error"]
