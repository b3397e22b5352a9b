"""`ray job submit` of the default job (ci_smoke preset) to a real two-node Ray cluster on loopback.

The job joins the running cluster through the RAY_ADDRESS the job supervisor sets, places one worker on each
node in IP order, trains, and writes its metrics; a job that asks for more CPUs than a node has fails within
its placement timeout, saying what is missing.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from loopback_cluster import CPUS_PER_NODE, HEAD_IP, WORKER_IP, start_cluster

from verl_like.utils.tracking import read_metrics

DEFAULT_JOB = ["python", "-m", "verl_like.main_ppo", "+trainer=ci_smoke"]


@pytest.fixture(scope="module")
def cluster():
    started = start_cluster()
    try:
        yield started
    finally:
        survivors = started.stop()
        shutil.rmtree(started.temp_dir, ignore_errors=True)
        assert not survivors, f"cluster processes survived SIGKILL: {survivors}"


@pytest.fixture
def job_env(verl_like_cache):
    # VLLM_CPU_KVCACHE_SPACE is also one of the driver's defaults: Ray refuses a job whose driver passes a key
    # the submitted runtime_env already sets, so this checks that init_ray leaves such keys to the job.
    return {"VERL_LIKE_CACHE_DIR": str(verl_like_cache), "VLLM_CPU_KVCACHE_SPACE": "1"}


def test_submitted_default_job_joins_the_cluster_and_runs_one_rank_per_node(cluster, job_env, tmp_path):
    run_dir = tmp_path / "run"
    args = [f"trainer.default_local_dir={run_dir}", "trainer.nnodes=2", "trainer.n_gpus_per_node=1",
            f"trainer.cpus_per_worker={CPUS_PER_NODE}"]
    result = cluster.submit([*DEFAULT_JOB, *args], job_env, timeout_s=480)
    logs = result.stdout
    assert result.returncode == 0, logs[-8000:]
    assert re.search(r"Job 'raysubmit_\w+' succeeded", logs), logs[-3000:]
    # It joined the running cluster (no local one), saw both nodes, and ranked them by IP.
    assert f"joining the Ray cluster at {cluster.gcs_address}" in logs
    assert "Started a local Ray instance" not in logs
    assert f"2 node(s): {HEAD_IP} (CPU={CPUS_PER_NODE}), {WORKER_IP} (CPU={CPUS_PER_NODE})" in logs
    assert f"node rank 0 on {HEAD_IP} (1 bundles), node rank 1 on {WORKER_IP} (1 bundles)" in logs
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    assert "val/score/mean" in records[-1] and "actor/pg_loss" in records[-1]
    _assert_upload_left_out_local_state(cluster.temp_dir)


def test_job_asking_for_more_than_the_cluster_has_fails_naming_what_is_missing(cluster, job_env, tmp_path):
    args = [f"trainer.default_local_dir={tmp_path / 'run'}", "trainer.nnodes=2", "trainer.n_gpus_per_node=1",
            f"trainer.cpus_per_worker={CPUS_PER_NODE + 1}", "trainer.timeouts.worker_start_timeout_s=5"]
    # The bound: the placement timeout (5 s) plus the job's start; a hanging job would hit the CLI timeout.
    result = cluster.submit([*DEFAULT_JOB, *args], job_env, timeout_s=300)
    logs = result.stdout
    assert result.returncode == 1, logs[-8000:]
    assert re.search(r"Job 'raysubmit_\w+' failed", logs), logs[-3000:]
    assert "ResourceUnavailableError" in logs
    assert "only 0 of 2 node groups could be placed within 5 s" in logs
    assert f"a node group needs CPU={CPUS_PER_NODE + 1} on one node" in logs
    assert f"2 node(s): {HEAD_IP} (CPU={CPUS_PER_NODE}), {WORKER_IP} (CPU={CPUS_PER_NODE})" in logs
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def _assert_upload_left_out_local_state(temp_dir: Path) -> None:
    """The working dir Ray unpacked for the job has the code and configs, not .git/.venv/checkpoints/tool state."""
    packages = [p for p in temp_dir.glob("session_latest/runtime_resources/working_dir_files/_ray_pkg_*") if p.is_dir()]
    assert len(packages) == 1, packages
    names = {path.name for path in packages[0].iterdir()}
    assert {"verl_like", "configs", "pyproject.toml"} <= names, names
    assert not {name for name in names if name.startswith(".")}, names
    assert "checkpoints" not in names and not any(name.endswith(".egg-info") for name in names)
