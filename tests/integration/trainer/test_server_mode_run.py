"""main_ppo with `actor_rollout_ref.rollout.mode=server`, run as a user runs it (real Hydra, Ray, FSDP2, vLLM servers).

- With an external server (the session's, started by `python -m verl_like.serve`) through `server.address`, the
  default job raises the held-out reward as the colocated one does.
- With a server the trainer starts on `rollout_pool`, killing that server mid-run ends the job within the timeout,
  naming the server, and no vLLM process outlives the job.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from test_main_ppo import DETERMINISTIC, _main_ppo, _run

from verl_like.utils.tracking import read_metrics

pytest.importorskip("vllm")


def vllm_processes() -> dict[int, str]:
    """pid -> command line of every vLLM server front process or engine process on this machine."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            title = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if "vllm.entrypoints.openai.api_server" in args or "EngineCore" in args or "EngineCore" in title:
            found[int(entry.name)] = args or title
    return found


@pytest.fixture(scope="module")
def cache_dir(verl_like_cache):
    return Path(verl_like_cache)


def test_default_job_through_an_external_server_raises_the_held_out_reward(cache_dir, tmp_path, vllm_server):
    _run(["actor_rollout_ref.rollout.mode=server", f"actor_rollout_ref.rollout.server.address=[{vllm_server}]",
          "trainer.total_training_steps=20", "trainer.test_freq=10", f"trainer.default_local_dir={tmp_path}"],
         cache_dir)
    records = read_metrics(tmp_path / "metrics.jsonl")
    val = {r["step"]: r["val/score/mean"] for r in records if "val/score/mean" in r}
    assert sorted(val) == [0, 10, 20]
    assert val[0] <= 0.3, val
    assert val[20] >= 0.6 and val[20] >= val[0] + 0.3, val
    # The server's sampled-token log-probs match the FSDP actor's on the same tokens every step (fp32).
    trained = [r for r in records if r["step"] > 0]
    assert all(r["rollout/logprob_diff_max"] < 1e-4 for r in trained)
    assert all(r["weight_sync/model_bytes"] > 0 for r in trained)


def test_a_killed_server_ends_the_job_naming_it_and_nothing_is_left(cache_dir, tmp_path, vllm_server):
    before = vllm_processes()  # the session's server
    proc = _main_ppo(["+trainer=ci_smoke", "actor_rollout_ref.rollout.mode=server", "trainer.total_training_steps=500",
                      "actor_rollout_ref.rollout.server.request_timeout_s=60", "trainer.test_freq=-1",
                      f"trainer.default_local_dir={tmp_path}"], cache_dir)
    try:
        deadline = time.monotonic() + 600
        metrics = tmp_path / "metrics.jsonl"
        while not (metrics.exists() and read_metrics(metrics)):
            assert proc.poll() is None, proc.stdout.read()[-4000:]
            assert time.monotonic() < deadline, "no step within 600 s"
            time.sleep(0.5)
        started = {pid: args for pid, args in vllm_processes().items() if pid not in before}
        fronts = [pid for pid, args in started.items() if "api_server" in args]
        assert len(fronts) == 1, started
        os.kill(fronts[0], signal.SIGKILL)
        killed = time.monotonic()
        out, _ = proc.communicate(timeout=120)
        ended = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    assert ended < 90, ended
    assert "server 0 (http://127.0.0.1:" in out, out[-3000:]
    deadline = time.monotonic() + 30  # an engine killed by its parent's death takes a moment to be reaped
    while set(vllm_processes()) != set(before) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert set(vllm_processes()) == set(before), vllm_processes()


SERVER = ["actor_rollout_ref.rollout.mode=server"]


def test_async_driver_at_staleness_zero_reproduces_the_synchronous_run(cache_dir, tmp_path, vllm_server):
    common = ["+trainer=ci_smoke", *SERVER, f"actor_rollout_ref.rollout.server.address=[{vllm_server}]",
              "trainer.total_training_steps=3", "trainer.test_freq=-1"]
    _run([*common, f"trainer.default_local_dir={tmp_path / 'sync'}"], cache_dir)
    _run([*common, "async_training.enable=true", "async_training.staleness=0",
          f"trainer.default_local_dir={tmp_path / 'async'}"], cache_dir)
    expected = read_metrics(tmp_path / "sync" / "metrics.jsonl")
    got = read_metrics(tmp_path / "async" / "metrics.jsonl")
    assert [r["step"] for r in got] == [r["step"] for r in expected] == [1, 2, 3]
    for want, have in zip(expected, got):
        assert have["async/staleness"] == 0.0 and have["async/weight_version"] == have["step"] - 1
        for key in DETERMINISTIC:
            assert have[key] == pytest.approx(want[key], rel=1e-6, abs=1e-7), (have["step"], key)


def test_async_driver_at_staleness_one_raises_the_held_out_reward(cache_dir, tmp_path, vllm_server):
    _run([*SERVER, f"actor_rollout_ref.rollout.server.address=[{vllm_server}]", "async_training.enable=true",
          "async_training.staleness=1", "algorithm.rollout_is=true", "trainer.total_training_steps=20",
          "trainer.test_freq=10", f"trainer.default_local_dir={tmp_path}"], cache_dir)
    records = read_metrics(tmp_path / "metrics.jsonl")
    val = {r["step"]: r["val/score/mean"] for r in records if "val/score/mean" in r}
    assert val[0] <= 0.3, val
    assert val[20] >= 0.6 and val[20] >= val[0] + 0.3, val
    trained = [r for r in records if r["step"] > 0]
    # Recorded versions: every batch after the first was generated one policy version behind, never more.
    assert [r["async/staleness"] for r in trained] == [0.0] + [1.0] * 19
    assert all(r["async/weight_version"] == r["step"] - 1 - r["async/staleness"] for r in trained)
    assert trained[-1]["async/staleness_count/1"] == 19.0
    # async_training.scale_lr_by_staleness lowers the rate only from lag 2 on: staleness 1 trains at the full lr.
    assert all(r["async/lr_scale"] == 1.0 and r["actor/lr"] == pytest.approx(1e-3, rel=1e-12) for r in trained)
    assert all(any(k.startswith("rollout_is/") for k in r) for r in trained)  # the IS correction ran every step


def test_killed_async_run_resumes_at_the_first_untrained_batch(cache_dir, tmp_path, vllm_server):
    """Staleness 2: when the step-2 checkpoint is written, the batches of steps 3 and 4 are already drawn and being
    generated; the checkpoint must still point the loader at step 3's batch, and the resumed run trains steps 3-4."""
    from verl_like.trainer.checkpoint import CheckpointManager

    run = tmp_path / "run"
    common = ["+trainer=ci_smoke", *SERVER, f"actor_rollout_ref.rollout.server.address=[{vllm_server}]",
              "async_training.enable=true", "async_training.staleness=2", "algorithm.rollout_is=true",
              "trainer.total_training_steps=4", "trainer.save_freq=2", "trainer.test_freq=-1",
              "trainer.resume_mode=auto", f"trainer.default_local_dir={run}"]
    proc = _main_ppo(common, cache_dir)
    try:
        deadline = time.monotonic() + 600
        metrics = run / "metrics.jsonl"
        while not (metrics.exists() and any(r["step"] == 3 for r in read_metrics(metrics))):
            assert proc.poll() is None, proc.stdout.read()[-4000:]
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # mid-run, after the step-2 checkpoint, with batches in flight
        proc.wait()
    state = CheckpointManager(run / "checkpoints").load_trainer_state(2)
    assert state["dataloader"]["position"] == 2, state["dataloader"]  # 2 batches trained; 3 and 4 were in flight
    _run(common, cache_dir)
    resumed = [r for r in read_metrics(metrics) if r["step"] >= 3]
    assert [r["step"] for r in resumed[-2:]] == [3, 4]
    # Resumed from version 2: step 3's batch was regenerated with the restored weights (no staler than before).
    assert resumed[-2]["async/weight_version"] == 2.0 and resumed[-1]["async/staleness"] <= 2.0
