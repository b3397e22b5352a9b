"""`+trainer=tool_agent` end to end as a user runs it (real Hydra, Ray, FSDP2, vLLM, the calculator tool): the
held-out reward and the share of samples that call the tool rise, the trainer's log-probs match the engine's on
every sampled token of the multi-turn trajectories, a kill -9 and resume repeats the interrupted step sample for
sample, and server mode at async staleness 1 with partial rollout learns too, every turn labelled with the policy
version that sampled it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verl_like.utils.tracking import read_metrics

REPO = Path(__file__).resolve().parents[3]
STEPS = 8
JOB = ["+trainer=tool_agent", f"trainer.total_training_steps={STEPS}", f"trainer.test_freq={STEPS}",
       "trainer.save_freq=4", "trainer.resume_mode=auto"]
# What depends only on the data, the seeds and the arithmetic: the sampled trajectories (their rewards, lengths,
# tool calls and turns) and the update computed on them.
SAMPLED = ("critic/score/mean", "response_length/mean", "agent/tool_calls_per_sample", "agent/num_turns/mean")
UPDATE = ("actor/pg_loss", "actor/grad_norm")


def _main_ppo(args: list[str], log=subprocess.PIPE) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    return subprocess.Popen([sys.executable, "-m", "verl_like.main_ppo", *args], cwd=REPO, env=env,
                            stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _run(args: list[str], timeout: float = 900) -> str:
    proc = _main_ppo(args)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.returncode == 0, out[-6000:]
    return out


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory) -> tuple[Path, str]:
    """The preset shortened to 8 steps (validated at 0 and 8, checkpointed at 4 and 8), killed with kill -9 (driver
    and cluster) once step 5 is logged, after the step-4 checkpoint, then resumed to the end. Its run directory and
    the resumed run's output."""
    from verl_like.trainer.checkpoint import CheckpointManager

    run = tmp_path_factory.mktemp("tool_agent")
    metrics = run / "metrics.jsonl"
    log_path = run / "first_launch.log"
    with open(log_path, "w") as log:  # a file, not a pipe nobody reads while the job runs
        proc = _main_ppo([*JOB, f"trainer.default_local_dir={run}"], log)
        deadline = time.monotonic() + 900
        while not (metrics.exists() and any(r["step"] == 5 for r in read_metrics(metrics))):
            assert proc.poll() is None, log_path.read_text()[-4000:]
            assert time.monotonic() < deadline, log_path.read_text()[-4000:]
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert CheckpointManager(run / "checkpoints").latest_step() == 4
    return run, _run([*JOB, f"trainer.default_local_dir={run}"])


def _trained(run: Path) -> list[dict]:
    return [r for r in read_metrics(run / "metrics.jsonl") if r["step"] > 0]


def test_reward_and_tool_use_rise_and_the_log_probs_match(interrupted):
    run, _ = interrupted
    records = read_metrics(run / "metrics.jsonl")
    val = {r["step"]: r["val/score/mean"] for r in records if "val/score/mean" in r}
    assert sorted(val) == [0, STEPS] and val[0] <= 0.3 and val[STEPS] >= 0.5, val
    trained = {r["step"]: r for r in _trained(run)}  # the resumed step 5 replaces the one logged before the kill
    calls = [trained[step]["agent/tool_calls_per_sample"] for step in sorted(trained)]
    assert sum(calls[-2:]) / 2 >= calls[0] + 0.3, calls  # the flawed teacher called it ~30 % of the time
    # vLLM's log-probs of every sampled token match the FSDP actor's on the same multi-turn ids (fp32; the tool's
    # and the template's tokens in between are neither sampled nor compared). One trajectory against one HF forward
    # is within 1e-5 (tests/integration/agents/test_agent_loops_vllm.py); over whole batches of differently composed
    # engine steps the largest gap is fp32 noise of 1e-5..1.3e-4 with a mean of 3e-7.
    for record in trained.values():
        assert record["rollout/logprob_diff_max"] < 5e-4 and record["rollout/logprob_diff_mean"] < 1e-6, record
        assert record["agent/infra_failures"] == 0 and record["agent/num_turns/mean"] > 1
    assert [trained[step]["weight_sync/version"] for step in sorted(trained)] == list(range(1, STEPS + 1))


def test_kill_9_and_resume_repeats_the_interrupted_step_sample_for_sample(interrupted):
    """Step 5 ran twice, before the kill and after the resume from the step-4 checkpoint: the same prompts, the same
    trajectories (rewards, lengths, tool calls, turns) and the same update; no step is missing."""
    run, out = interrupted
    assert "resum" in out.lower()
    records = _trained(run)
    assert sorted(r["step"] for r in records) == [1, 2, 3, 4, 5, 5, 6, 7, 8]
    before, after = [r for r in records if r["step"] == 5]
    for key in SAMPLED:
        assert after[key] == pytest.approx(before[key], abs=1e-9), key
    for key in UPDATE:
        assert after[key] == pytest.approx(before[key], rel=1e-5, abs=1e-7), key


# Off-policy by one version (the preset's lr, 5e-4: at 1e-3 it collapses; docs/agents.md, "Asynchronous training").
ASYNC = ["actor_rollout_ref.rollout.mode=server", "async_training.enable=true", "async_training.staleness=1",
         "algorithm.rollout_is=true"]


def test_server_mode_at_staleness_1_with_partial_rollout_learns_and_labels_every_turn(tmp_path):
    """The agent loops run against a vLLM server the trainer starts; generation of batch t+1 overlaps the update on
    batch t, and every trained batch is one version old. With partial rollout the sync after step t does not wait
    for batch t+1's agent loops: their in-flight turns are frozen on the server (vLLM's pause "keep") and finished
    by the new weights. vLLM labels every output token with the weight version that sampled it; the rollout dump
    records each turn's version. The held-out reward and the share of samples calling the tool rise all the same.
    (One run for both: on this 2-core machine a sync met 99-256 turns in flight at most steps; whether one does
    depends on timing, so a run where none did skips the last check, the frozen-turn bookkeeping itself being
    unit-tested in tests/unit/agents/test_tool_agent_loop.py with a scripted update mid-turn. Staleness 1 without
    partial rollout is the single-turn job's test in tests/integration/trainer/test_server_mode_run.py.)"""
    import json

    run = tmp_path / "server"
    steps = 8
    _run(["+trainer=tool_agent", f"trainer.total_training_steps={steps}", f"trainer.test_freq={steps}", *ASYNC,
          "async_training.partial_rollout=true", f"trainer.rollout_data_dir={run / 'rollouts'}",
          f"trainer.default_local_dir={run}"])
    records = read_metrics(run / "metrics.jsonl")
    val = {r["step"]: r["val/score/mean"] for r in records if "val/score/mean" in r}
    assert val[0] <= 0.3 and val[steps] >= 0.5, val
    trained = _trained(run)
    assert [r["step"] for r in trained] == list(range(1, steps + 1))
    calls = [r["agent/tool_calls_per_sample"] for r in trained]
    assert sum(calls[-2:]) / 2 >= calls[0] + 0.3, calls
    assert all(r["agent/infra_failures"] == 0 and "rollout_is/mean" in r for r in trained)
    assert [r["async/staleness"] for r in trained] == [0.0] + [1.0] * (steps - 1)
    assert trained[0]["rollout/logprob_diff_max"] < 1e-4  # the first batch is on-policy: the server matches FSDP
    for step in range(1, steps + 1):
        for line in (run / "rollouts" / f"{step}.jsonl").read_text().splitlines():
            record = json.loads(line)
            versions = record["turn_versions"]
            # launched at weight_version; no turn newer than the policy that trains on it (step - 1 syncs)
            assert record["weight_version"] <= min(versions) and max(versions) <= step - 1, (step, record)
    frozen = sum(r["agent/turns_across_update"] for r in trained)
    if frozen == 0:
        pytest.skip("no weight sync met a turn in flight on this run (timing on 2 shared CPUs)")
