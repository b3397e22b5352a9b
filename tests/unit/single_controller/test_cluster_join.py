"""Which Ray cluster the driver joins, what a submitted job's runtime_env keeps, and the order of nodes."""

from __future__ import annotations

import json
import logging
import socket

import pytest

from verl_like.config.errors import ConfigError
from verl_like.config.trainer import RayInitConfig
from verl_like.single_controller.cluster import (
    JOB_CONFIG_ENV,
    format_resources,
    job_env_vars,
    job_scratch_path,
    node_order_key,
    resolve_cluster_address,
)


@pytest.fixture
def no_cluster(monkeypatch, tmp_path):
    """No $RAY_ADDRESS, no job, and a Ray temp dir of our own (where `ray start` records its cluster)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv(JOB_CONFIG_ENV, raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    (tmp_path / "ray").mkdir()
    return tmp_path / "ray" / "ray_current_cluster"


def test_nothing_to_join_means_a_local_cluster(no_cluster):
    assert resolve_cluster_address(None) is None


def test_ray_address_from_the_environment_is_joined(no_cluster, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert resolve_cluster_address(None) == "10.0.0.5:6379"


def test_configured_address_wins_over_the_environment_and_local_forces_a_new_cluster(no_cluster, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert resolve_cluster_address("auto") == "auto"
    assert resolve_cluster_address("10.0.0.9:6379") == "10.0.0.9:6379"
    assert resolve_cluster_address("local") is None


@pytest.mark.parametrize("source", ["config", "env"])
def test_dashboard_address_is_refused_naming_where_it_came_from(no_cluster, monkeypatch, source):
    url = "http://127.0.0.1:8265"
    if source == "env":
        monkeypatch.setenv("RAY_ADDRESS", url)
    key = "trainer.ray_address" if source == "config" else "$RAY_ADDRESS"
    with pytest.raises(ValueError, match=rf"{key.replace('$', '[$]')}='http://127.0.0.1:8265' is a Ray dashboard"):
        resolve_cluster_address(url if source == "config" else None)


def test_cluster_recorded_by_ray_start_is_joined_while_it_answers(no_cluster, caplog):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        no_cluster.write_text(address)
        assert resolve_cluster_address(None) == address
    # The same record once nothing listens there (a cluster that died without `ray stop`): start a local one.
    with caplog.at_level(logging.WARNING, logger="verl_like.single_controller.cluster"):
        assert resolve_cluster_address(None) is None
    assert f"ignoring {address}" in caplog.text


def test_job_env_vars_are_read_from_the_job_config(no_cluster, monkeypatch):
    assert job_env_vars() == {}
    config = {"runtime_env": {"working_dir": "gcs://_ray_pkg_x.zip", "env_vars": {"VLLM_CPU_KVCACHE_SPACE": "2"}}}
    monkeypatch.setenv(JOB_CONFIG_ENV, json.dumps(config))
    assert job_env_vars() == {"VLLM_CPU_KVCACHE_SPACE": "2"}


def test_relative_output_dir_is_flagged_only_inside_a_job_with_an_uploaded_working_dir(
    no_cluster, monkeypatch, tmp_path
):
    monkeypatch.chdir(tmp_path)
    assert job_scratch_path("checkpoints/run") is None
    monkeypatch.setenv(JOB_CONFIG_ENV, json.dumps({"runtime_env": {"working_dir": "gcs://_ray_pkg_x.zip"}}))
    assert job_scratch_path("checkpoints/run") == tmp_path / "checkpoints/run"
    assert job_scratch_path("/shared/run") is None
    monkeypatch.setenv(JOB_CONFIG_ENV, json.dumps({"runtime_env": {"env_vars": {"A": "1"}}}))
    assert job_scratch_path("checkpoints/run") is None


def test_nodes_are_ordered_by_numeric_ip_then_node_id():
    nodes = [("10.0.0.10", "a"), ("10.0.0.9", "b"), ("fe80::1", "c"), ("head-node", "d"), ("10.0.0.9", "a")]
    ordered = sorted(nodes, key=lambda node: node_order_key(*node))
    assert ordered == [("10.0.0.9", "a"), ("10.0.0.9", "b"), ("10.0.0.10", "a"), ("fe80::1", "c"), ("head-node", "d")]


def test_resources_are_shown_without_memory_and_node_markers():
    resources = {"CPU": 8.0, "GPU": 4.0, "memory": 1e9, "object_store_memory": 1e8, "node:10.0.0.1": 1.0,
                 "accelerator_type:H200": 1.0, "custom": 0.5}
    assert format_resources(resources) == "CPU=8, GPU=4, custom=0.5"
    assert format_resources({"memory": 1.0}) == "no CPU/GPU"


def test_dashboard_host_defaults_to_loopback_and_must_not_be_empty():
    assert RayInitConfig().dashboard_host == "127.0.0.1"
    with pytest.raises(ConfigError, match="trainer.ray_init.dashboard_host is empty"):
        RayInitConfig(dashboard_host="")
