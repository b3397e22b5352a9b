"""RewardManager: scores on the last valid token, metrics, and every way a scorer can fail in real worker
processes (raise, hang past the timeout, kill its process, return a non-number) giving 0 without stopping."""

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from verl_like.models.tiny import build_tokenizer
from verl_like.protocol import DataProto
from verl_like.rewards.custom import load_custom_function
from verl_like.rewards.error_policy import RewardError
from verl_like.rewards.manager import RewardManager
from verl_like.rewards.pool import ScoringPool

FNS = str(Path(__file__).with_name("reward_fns.py"))


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def rollout_batch(tokenizer, texts, truths, width=6, data_source="synthetic/add", eos=True):
    """A rollout-like batch: right-padded `responses` (text + eos) and `response_mask`."""
    rows = len(texts)
    responses = torch.full((rows, width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((rows, width), dtype=torch.long)
    for i, text in enumerate(texts):
        ids = tokenizer.encode(text, add_special_tokens=False)
        ids = (ids + [tokenizer.eos_token_id] if eos else ids)[:width]
        responses[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        mask[i, : len(ids)] = 1
    return DataProto.from_dict(
        tensors={"responses": responses, "response_mask": mask},
        non_tensors={"data_source": [data_source] * rows, "ground_truth": list(truths),
                     "extra_info": [{"i": i} for i in range(rows)]},
    )


def reference_token_scores(mask, scores):
    expected = torch.zeros(mask.shape)
    for row in range(mask.shape[0]):
        valid = [t for t in range(mask.shape[1]) if mask[row, t]]
        expected[row, valid[-1] if valid else 0] = scores[row]
    return expected


@pytest.fixture(scope="module")
def pooled(tokenizer):
    manager = RewardManager(tokenizer, load_custom_function(FNS, "misbehaving"), num_workers=2, timeout_s=1.5,
                            error_policy="zero")
    yield manager
    manager.close()


def test_default_scorers_in_process(tokenizer):
    batch = rollout_batch(tokenizer, ["85", "12", "7", "123456789"], ["85", "13", "7", "123456789"])
    manager = RewardManager(tokenizer, num_workers=0)
    scores, metrics = manager.score(batch)
    expected = reference_token_scores(batch.batch["response_mask"], [1.0, 0.0, 1.0, 0.0])  # last: cut by width
    assert torch.equal(scores, expected)
    assert metrics == {"reward/score_mean": 0.5, "reward/score_max": 1.0, "reward/score_min": 0.0,
                       "reward/errors": 0.0, "reward/timeouts": 0.0}


def test_default_scorers_in_worker_processes_match_in_process(tokenizer):
    # The tiny alphabet has no '#' or '\\': gsm8k and MATH responses here score 0 (no marker, no box).
    texts = ["85", "4", "123", "3"]
    batch = rollout_batch(tokenizer, texts, ["85", "4", "123", "3"])
    batch.non_tensor_batch["data_source"] = np.array(
        ["synthetic/add", "openai/gsm8k", "synthetic/sort", "lighteval/MATH"], dtype=object)
    local, local_metrics = RewardManager(tokenizer, num_workers=0).score(batch)
    with RewardManager(tokenizer, num_workers=2) as manager:
        pooled, pooled_metrics = manager.score(batch)
    assert torch.equal(local, pooled) and local_metrics == pooled_metrics
    assert local.sum(-1).tolist() == [1.0, 0.0, 1.0, 0.0]


def test_failures_score_zero_and_are_counted(pooled, tokenizer):
    truths = ["5", "raise", "hang", "die", "none", "nan", "dict", "dict-without-score", "bool", "6"]
    batch = rollout_batch(tokenizer, ["5"] * len(truths), truths)
    start = time.monotonic()
    scores, metrics = pooled.score(batch)
    assert time.monotonic() - start < 60  # the hung scorer was abandoned, not waited for
    per_row = scores.sum(-1).tolist()
    assert per_row == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.25, 0.0, 1.0, 0.0]
    assert metrics["reward/errors"] == 6.0  # raise, hang, die, none, nan, dict without score
    assert metrics["reward/timeouts"] == 1.0
    # The pool replaced the killed and the dead worker and keeps scoring.
    again, metrics = pooled.score(rollout_batch(tokenizer, ["1", "2"], ["1", "3"]))
    assert again.sum(-1).tolist() == [1.0, 0.0] and metrics["reward/errors"] == 0.0


def test_error_messages_say_what_happened(pooled):
    tasks = [dict(data_source="x", solution_str="1", ground_truth=truth, extra_info=None)
             for truth in ("raise", "die", "none", "hang")]
    outcomes = pooled.score_tasks(tasks)
    assert "RuntimeError: scorer bug" in outcomes[0].error and "in misbehaving" in outcomes[0].error
    assert "died (exit code 3)" in outcomes[1].error
    assert "returned None; it must return a finite number" in outcomes[2].error
    assert outcomes[3].timed_out and "past the timeout of 1.5 s" in outcomes[3].error


def test_in_process_scoring_catches_exceptions(tokenizer):
    manager = RewardManager(tokenizer, load_custom_function(FNS, "misbehaving"), num_workers=0)
    scores, metrics = manager.score(rollout_batch(tokenizer, ["5", "5"], ["raise", "5"]))
    assert scores.sum(-1).tolist() == [0.0, 1.0] and metrics["reward/errors"] == 1.0


def test_closure_reward_function_travels_to_workers(tokenizer):
    target = "7"

    def closure(data_source, solution_str, ground_truth, extra_info=None):
        return 2.0 if solution_str == target else 0.0

    with RewardManager(tokenizer, closure, num_workers=1) as manager:
        scores, _ = manager.score(rollout_batch(tokenizer, ["7", "8"], ["", ""]))
    assert scores.sum(-1).tolist() == [2.0, 0.0]


def test_empty_response_scores_at_position_zero(tokenizer):
    batch = rollout_batch(tokenizer, ["", "3"], ["", "3"], eos=False)
    scores, _ = RewardManager(tokenizer, num_workers=0).score(batch)
    assert scores[0].tolist() == [1.0, 0, 0, 0, 0, 0] and scores[1].tolist() == [1.0, 0, 0, 0, 0, 0]


def test_reward_fn_key_and_missing_columns(tokenizer):
    batch = rollout_batch(tokenizer, ["1"], ["1"])
    batch.non_tensor_batch["task"] = batch.non_tensor_batch.pop("data_source")
    assert RewardManager(tokenizer, num_workers=0, reward_fn_key="task").score(batch)[0].sum() == 1.0
    with pytest.raises(KeyError, match=r"no non-tensor column 'data_source' \(columns: \['extra_info'"):
        RewardManager(tokenizer, num_workers=0).score(batch)
    batch.non_tensor_batch.pop("extra_info")  # optional
    assert RewardManager(tokenizer, num_workers=0, reward_fn_key="task").score(batch)[0].sum() == 1.0


def test_bad_arguments(tokenizer):
    with pytest.raises(ValueError, match="num_workers=-1 must be >= 0"):
        RewardManager(tokenizer, num_workers=-1)
    with pytest.raises(ValueError, match="cannot take the reward arguments"):
        RewardManager(tokenizer, lambda text: 0.0, num_workers=0)
    with pytest.raises(ValueError, match="timeout_s=0 must be > 0"):
        ScoringPool(lambda **kw: 0.0, 1, 0)
    with pytest.raises(ValueError, match="num_workers=0 must be >= 1 for a process pool"):
        ScoringPool(lambda **kw: 0.0, 0, 1.0)


def test_worker_killed_while_idle_is_replaced(tokenizer):
    pool = ScoringPool(load_custom_function(FNS, "misbehaving"), 1, 5.0)
    try:
        task = dict(data_source="x", solution_str="1", ground_truth="1", extra_info=None)
        assert pool.map([task])[0].score == 1.0
        pool._workers[0].process.kill()
        pool._workers[0].process.join()
        outcome = pool.map([task])[0]
        assert outcome.score == 1.0 and outcome.error is None
    finally:
        pool.close()


def test_fail_policy_stops_when_most_of_a_batch_fails_naming_the_first_failure(tokenizer):
    manager = RewardManager(tokenizer, load_custom_function(FNS, "misbehaving"), num_workers=0)
    batch = rollout_batch(tokenizer, ["5"] * 4, ["5", "raise", "nan", "raise"], data_source="mine")
    with pytest.raises(RewardError, match=r"failed for 3 of 4 samples, more than reward_model.max_error_fraction=0.5"
                       r".*first: sample 1 \(data_source 'mine'\): RuntimeError: scorer bug.*error_policy=zero"):
        manager.score(batch)
    # Half failing is within the default budget: scored 0 and counted.
    scores, metrics = manager.score(rollout_batch(tokenizer, ["5"] * 4, ["5", "raise", "nan", "5"]))
    assert scores.sum(-1).tolist() == [1.0, 0.0, 0.0, 1.0] and metrics["reward/errors"] == 2.0


def test_zero_policy_trains_on_zeros_and_max_fraction_zero_stops_at_the_first(tokenizer):
    fn = load_custom_function(FNS, "misbehaving")
    batch = rollout_batch(tokenizer, ["5"] * 2, ["raise", "raise"])
    scores, metrics = RewardManager(tokenizer, fn, num_workers=0, error_policy="zero").score(batch)
    assert scores.sum().item() == 0.0 and metrics["reward/errors"] == 2.0
    strict = RewardManager(tokenizer, fn, num_workers=0, max_error_fraction=0.0)
    with pytest.raises(RewardError, match="failed for 1 of 2 samples"):
        strict.score(rollout_batch(tokenizer, ["5"] * 2, ["5", "raise"]))


def test_data_source_without_a_scorer_counts_as_an_error_and_fails_the_batch(tokenizer):
    batch = rollout_batch(tokenizer, ["1", "2"], ["1", "2"], data_source="nobody/scores/this")
    with pytest.raises(RewardError, match=r"data sources \['nobody/scores/this'\].*no rule scorer for data_source"):
        RewardManager(tokenizer, num_workers=0).score(batch)


def test_skip_policy_reports_the_failed_samples(tokenizer):
    manager = RewardManager(tokenizer, load_custom_function(FNS, "misbehaving"), num_workers=0, error_policy="skip")
    result = manager.score_batch(rollout_batch(tokenizer, ["5"] * 3, ["5", "nan", "5"]))
    assert result.failed_mask().tolist() == [False, True, False]
    assert "returned nan" in result.failed[0].error


def test_bad_policy_arguments(tokenizer):
    with pytest.raises(ValueError, match="error_policy='ignore' must be one of"):
        RewardManager(tokenizer, num_workers=0, error_policy="ignore")
    with pytest.raises(ValueError, match="max_error_fraction=1.5 must lie in"):
        RewardManager(tokenizer, num_workers=0, max_error_fraction=1.5)


def test_pool_workers_outlast_ctrl_c_and_an_idle_worker_killed_by_sigterm_is_replaced(tokenizer):
    import os
    import signal

    pool = ScoringPool(load_custom_function(FNS, "misbehaving"), 1, 5.0)
    try:
        task = dict(data_source="x", solution_str="1", ground_truth="1", extra_info=None)
        assert pool.map([task])[0].score == 1.0  # the worker is up and has installed its handlers
        pid = pool._workers[0].process.pid
        os.kill(pid, signal.SIGINT)
        outcome = pool.map([task])[0]
        assert outcome.error is None and pool._workers[0].process.pid == pid
        os.kill(pid, signal.SIGTERM)
        pool._workers[0].process.join(timeout=5)
        outcome = pool.map([task])[0]
        assert outcome.error is None and pool._workers[0].process.pid != pid
    finally:
        pool.close()
