"""main_ppo end to end: real Hydra, real Ray, vLLM rollout, FSDP2 on 2 CPU workers, run as a user runs it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verl_like.utils.tracking import read_metrics

REPO = Path(__file__).resolve().parents[3]
# Metrics that depend only on the data, the seeds and the arithmetic (not on wall time).
DETERMINISTIC = ("critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/grad_norm", "critic/advantages/mean")


@pytest.fixture(scope="module")
def cache_dir(verl_like_cache):
    """The session's model/data cache, so the warm-start model is built once."""
    return Path(verl_like_cache)


def _main_ppo(args: list[str], cache_dir: Path, **popen) -> subprocess.Popen:
    env = {**os.environ, "VERL_LIKE_CACHE_DIR": str(cache_dir), "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    return subprocess.Popen(
        [sys.executable, "-m", "verl_like.main_ppo", *args], cwd=REPO, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, **popen,
    )


def _run(args: list[str], cache_dir: Path, timeout: float = 600) -> str:
    proc = _main_ppo(args, cache_dir)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.returncode == 0, out[-6000:]
    return out


def test_bad_config_fails_before_ray_with_the_key_named(cache_dir):
    start = time.monotonic()
    proc = _main_ppo(["data.train_batch_size=7", "actor_rollout_ref.actor.ppo_mini_batch_size=4"], cache_dir)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "config error" in out and "train_batch_size" in out
    assert "Started a local Ray instance" not in out
    assert time.monotonic() - start < 60


RESUMABLE = ["+trainer=ci_smoke", "trainer.total_training_steps=4", "trainer.save_freq=2", "trainer.resume_mode=auto"]


@pytest.fixture(scope="module")
def uninterrupted(cache_dir, tmp_path_factory) -> Path:
    """The run directory of the ci_smoke job made resumable (4 steps, validated at 2 and 4, checkpointed at 2 and 4),
    run straight through: the smoke test checks what it logged, the interrupted runs must reproduce it once resumed."""
    straight = tmp_path_factory.mktemp("straight")
    _run([*RESUMABLE, f"trainer.default_local_dir={straight}", f"trainer.rollout_data_dir={straight / 'rollouts'}"],
         cache_dir)
    return straight


def read_dumps(directory: Path) -> dict[int, list[dict]]:
    """step -> the records of <directory>/<step>.jsonl (trainer.rollout_data_dir)."""
    return {int(path.stem): [json.loads(line) for line in path.read_text().splitlines()]
            for path in directory.glob("*.jsonl")}


def test_ci_smoke_job_trains_validates_and_logs(uninterrupted):
    records = read_metrics(uninterrupted / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    last = records[-1]
    for key in ("val/score/mean", "actor/pg_loss", "actor/grad_norm", "rollout/logprob_diff_mean", "timing_s/gen"):
        assert key in last, sorted(last)
    # vLLM's sampled-token logprobs agree with the FSDP actor's on the same tokens (fp32).
    assert last["rollout/logprob_diff_mean"] < 1e-3
    # Where the start-up went, once, with the first step; each part (a maximum over ranks) within the whole.
    startup = {k: v for k, v in records[0].items() if k.startswith("startup/")}
    assert set(startup) == {f"startup/{name}_s" for name in (
        "worker_processes", "resource_pool", "process_start", "role_construction", "actor_engine", "vllm_import",
        "rollout_engine", "first_sync", "total")}, sorted(startup)
    assert all(0 < v <= startup["startup/total_s"] for v in startup.values()), startup
    parts = ("resource_pool", "process_start", "role_construction")
    assert sum(startup[f"startup/{p}_s"] for p in parts) <= startup["startup/worker_processes_s"], startup
    assert not any(k.startswith("startup/") for r in records[1:] for k in r)


def _wait_for_step(proc: subprocess.Popen, metrics: Path, step: int) -> None:
    deadline = time.monotonic() + 600
    while not (metrics.exists() and any(r["step"] == step for r in read_metrics(metrics))):
        assert proc.poll() is None, proc.stdout.read()[-4000:]
        assert time.monotonic() < deadline
        time.sleep(0.2)


def _assert_every_step_matches(metrics: Path, expected: dict) -> None:
    """Every logged record (a step logged twice, before a crash and after the resume, counts twice) matches."""
    records = read_metrics(metrics)
    assert {r["step"] for r in records} == {1, 2, 3, 4}
    for record in records:
        for key in DETERMINISTIC:
            expected_value = expected[record["step"]][key]
            assert record[key] == pytest.approx(expected_value, rel=1e-6, abs=1e-7), (record["step"], key)


def _assert_no_process_left(sid: int) -> None:
    """No process of the driver's session remains: Ray workers (vLLM inside them) have process groups of their
    own but stay in the driver's session."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        left = _session_processes(sid)
        if not left:
            return
        time.sleep(0.5)
    raise AssertionError(f"processes of the stopped run remain: {left}")


def test_sigterm_then_kill_then_resume_reproduces_the_uninterrupted_run(cache_dir, tmp_path, uninterrupted):
    """Preemption (SIGTERM to the driver alone: it checkpoints the step in flight, stops its workers and Ray, exits
    143 within 60 s), then a hard crash (kill -9 of driver and cluster after the step-2 checkpoint); each resume
    reproduces the uninterrupted run's metrics."""
    from verl_like.trainer.checkpoint import CheckpointManager

    run = tmp_path / "interrupted"
    metrics = run / "metrics.jsonl"
    proc = _main_ppo([*RESUMABLE, f"trainer.default_local_dir={run}"], cache_dir)
    _wait_for_step(proc, metrics, 1)
    proc.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, out[-4000:]
    assert time.monotonic() - signalled < 60
    stopped_at = max(r["step"] for r in read_metrics(metrics))
    assert f"stopped by SIGTERM after step {stopped_at}; checkpoint" in out
    assert CheckpointManager(run / "checkpoints").latest_step() == stopped_at
    _assert_no_process_left(proc.pid)

    if stopped_at < 3:
        proc = _main_ppo([*RESUMABLE, f"trainer.default_local_dir={run}"], cache_dir)
        _wait_for_step(proc, metrics, 3)
        os.killpg(proc.pid, signal.SIGKILL)  # driver and its local Ray cluster, mid-run, after the step-2 checkpoint
        proc.wait()
        _assert_no_process_left(proc.pid)  # the Ray workers (own process groups) notice and exit
    _run([*RESUMABLE, f"trainer.default_local_dir={run}"], cache_dir)
    _assert_every_step_matches(metrics, {r["step"]: r for r in read_metrics(uninterrupted / "metrics.jsonl")})


def _session_processes(sid: int) -> list[str]:
    out = subprocess.run(["ps", "-ww", "-eo", "pid=,sid=,args="], capture_output=True, text=True).stdout
    rows = [line.split(None, 2) for line in out.splitlines()]
    return [" ".join(r) for r in rows if len(r) == 3 and int(r[1]) == sid]


def test_a_killed_worker_restarts_the_run_from_its_checkpoint_in_the_same_process(cache_dir, tmp_path,
                                                                                 uninterrupted):
    """trainer.max_restarts=1: kill -9 of an FSDP worker (vLLM inside) once step 2 and its checkpoint are written;
    the driver starts the groups again in the same process, resumes from step 2 and finishes: every logged step
    (those before the kill, and the steps trained again) equals the uninterrupted run's, and so do its rollout dumps
    (trainer.rollout_data_dir): no sample is lost or repeated across the restart; nothing is left."""
    run = tmp_path / "restarted"
    metrics = run / "metrics.jsonl"
    proc = _main_ppo([*RESUMABLE, "trainer.max_restarts=1", f"trainer.default_local_dir={run}",
                      f"trainer.rollout_data_dir={run / 'rollouts'}"], cache_dir)
    try:
        _wait_for_step(proc, metrics, 2)  # the step-2 checkpoint is written before step 2 is logged
        workers = [row.split(None, 2)[0] for row in _session_processes(proc.pid) if "WorkerHost" in row]
        assert len(workers) == 2, _session_processes(proc.pid)
        os.kill(int(workers[-1]), signal.SIGKILL)
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-6000:]
    assert "restarting the worker groups from the newest checkpoint (restart 1 of trainer.max_restarts=1)" in out
    expected = {r["step"]: r for r in read_metrics(uninterrupted / "metrics.jsonl")}
    _assert_every_step_matches(metrics, expected)
    assert [r["step"] for r in read_metrics(metrics)][-2:] == [3, 4]
    # Each step's dump (step 3's rewritten by the restarted groups) holds the uninterrupted run's samples (uids are
    # random per run); over the 4 steps every prompt row is trained once, in groups of rollout.n.
    dumps, straight = read_dumps(run / "rollouts"), read_dumps(uninterrupted / "rollouts")
    assert sorted(p.name for p in (run / "rollouts").iterdir()) == [f"{step}.jsonl" for step in range(1, 5)]

    def samples(records):
        return sorted((r["index"], r["input"], r["output"], r["score"], r["weight_version"]) for r in records)

    assert {step: samples(records) for step, records in dumps.items()} == {
        step: samples(records) for step, records in straight.items()}
    rows = [row for step in range(1, 5) for row in sorted({r["index"] for r in dumps[step]})]
    assert len(rows) == len(set(rows)) == 4 * 8, rows  # 4 disjoint batches of train_batch_size=8 prompts
    assert all(len({r["uid"] for r in dumps[step]}) == 8 for step in dumps)
    _assert_no_process_left(proc.pid)


def test_default_job_shortened_raises_the_held_out_reward(cache_dir, tmp_path):
    """The embedded default (no preset), only fewer steps: held-out greedy reward must rise clearly. It runs as the
    defaults run on a GPU: no rollout log-probs (calculate_log_probs auto is false on CUDA), and the old log-probs
    from the update's own forward (one optimizer step per batch), so neither forward nor gap metric appears."""
    out = _run(["trainer.total_training_steps=10", "trainer.test_freq=5", f"trainer.default_local_dir={tmp_path}",
                "actor_rollout_ref.rollout.calculate_log_probs=false"], cache_dir)
    records = read_metrics(tmp_path / "metrics.jsonl")
    trained = [r for r in records if "timing_s/step" in r]
    assert len(trained) == 10 and not any("timing_s/old_log_prob" in r or "rollout/logprob_diff_mean" in r
                                         for r in trained), sorted(trained[0])
    val = {r["step"]: r["val/score/mean"] for r in records if "val/score/mean" in r}
    assert sorted(val) == [0, 5, 10]
    assert val[0] <= 0.3, val
    assert val[10] >= 0.6 and val[10] >= val[0] + 0.3, val
    # The run ends with its summary, after the workers' last lines (issue #31).
    summary = out[out.index("run finished: 10 step(s) (step 0 -> 10)"):]
    assert f"held-out reward (val/score/mean): {val[0]:.3f} at step 0 -> {val[10]:.3f} at step 10" in summary
    assert f"TensorBoard: tensorboard --logdir {tmp_path}/tensorboard" in summary
    assert f"report: python -m verl_like.report {tmp_path}" in summary and "checkpoints: none saved" in summary
    # Each step logs the actor workers' memory (the largest worker); on CPU only the host's, which the summary gives.
    host = [r["perf/cpu_memory_used_gb"] for r in trained]
    assert all(0.1 < gib < 24 for gib in host) and not any("perf/max_memory_allocated_gb" in r for r in trained), host
    assert f"peak memory of an actor worker: host {max(host):.1f} GiB resident" in summary
    # Nothing of the workers' comes after the summary (their weight-loading bars used to, flushed at their exit;
    # vLLM's warning about $VLLM_DIST_IDENT left behind by an in-process engine of an earlier test did too).
    assert "WorkerHost" not in summary, summary
    # vLLM's, torch's and Ray's start-up notices stay below the default trainer.log_level (issue #31).
    for notice in ("LD_PRELOAD", "Triton", "NUMA binding", "FutureWarning", "Token authentication",
                   "Set ray log level", "global random seed"):
        assert notice not in out, [line for line in out.splitlines() if notice in line][:3]


def test_online_dpo_preset_raises_the_held_out_reward(cache_dir, tmp_path):
    """`+trainer=online_dpo`, shortened: pairs judged by the rule reward, DPO against the reference."""
    _run(["+trainer=online_dpo", "trainer.total_training_steps=6", "trainer.test_freq=6",
          f"trainer.default_local_dir={tmp_path}"], cache_dir)
    records = read_metrics(tmp_path / "metrics.jsonl")
    val = {r["step"]: r["val/score/mean"] for r in records if "val/score/mean" in r}
    assert sorted(val) == [0, 6]
    assert val[0] <= 0.3, val
    assert val[6] >= 0.5 and val[6] >= val[0] + 0.3, val
    last = records[-1]
    for key in ("actor/dpo_loss", "actor/dpo_rewards_margin", "actor/dpo_rewards_accuracy",
                "actor/dpo_logratio_chosen", "actor/dpo_logratio_rejected", "dpo/valid_pair_frac"):
        assert key in last, sorted(last)


def test_distill_preset_brings_the_student_to_the_teacher(cache_dir, tmp_path):
    """`+trainer=distill`, shortened: a correct teacher's top-k log-probs pull the flawed warm start towards it,
    without the reward in the loss."""
    _run(["+trainer=distill", "trainer.total_training_steps=6", "trainer.test_freq=6",
          f"trainer.default_local_dir={tmp_path}"], cache_dir)
    records = read_metrics(tmp_path / "metrics.jsonl")
    val = {r["step"]: r["val/score/mean"] for r in records if "val/score/mean" in r}
    divergence = [r["actor/distill_divergence"] for r in records if "actor/distill_divergence" in r]
    assert len(divergence) == 6
    assert divergence[-1] < 0.5 * divergence[0], divergence
    assert val[0] <= 0.3 and val[6] >= val[0] + 0.2, val
    assert "timing_s/teacher" in records[-1]
