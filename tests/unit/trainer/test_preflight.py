"""Preflight: what this machine cannot honour is refused before Ray, naming the key and the fix."""

from __future__ import annotations

import compileall
import importlib.util
import json
import logging
import socket
import sys

import pytest

from verl_like.config.errors import ConfigError
from verl_like.config.loader import load_config
from verl_like.trainer import preflight
from verl_like.trainer.preflight import PreflightError, run_preflight


def _config(tmp_path, *overrides):
    return load_config(["+trainer=ci_smoke", f"trainer.default_local_dir={tmp_path / 'run'}", *overrides])


def test_the_ci_smoke_config_passes_and_creates_the_run_dir(tmp_path):
    run_preflight(_config(tmp_path), joining_cluster=False)
    assert (tmp_path / "run").is_dir() and not list((tmp_path / "run").iterdir())


def test_cuda_without_gpus_fails_at_once_naming_trainer_device(tmp_path):
    config = _config(tmp_path, "trainer.device=cuda")
    expected = r"trainer.device=cuda but this machine has no usable GPU.*trainer.device=cpu"
    with pytest.raises(PreflightError, match=expected):
        preflight.check_devices(config, cuda_devices=0)


def test_more_gpus_than_present_names_n_gpus_per_node(tmp_path):
    config = _config(tmp_path, "trainer.device=cuda", "trainer.n_gpus_per_node=2")
    with pytest.raises(PreflightError, match=r"trainer.n_gpus_per_node = 2 trainer workers ask 2 GPUs but the local "
                                              r"cluster has 1.*lower trainer.n_gpus_per_node"):
        preflight.check_devices(config, cuda_devices=1)
    preflight.check_devices(config, cuda_devices=2)


def test_started_servers_and_role_pools_count_with_the_trainer(tmp_path, monkeypatch):
    monkeypatch.setattr(preflight.os, "cpu_count", lambda: 2)
    config = _config(tmp_path, "trainer.ray_init.num_cpus=null", "actor_rollout_ref.rollout.mode=server")
    with pytest.raises(PreflightError, match=r"3 processes \(.*1 vLLM server\(s\) on rollout_pool.*need 3 logical CPUs"):
        preflight.check_devices(config, cuda_devices=0)
    gpus = _config(tmp_path, "trainer.device=cuda", "trainer.n_gpus_per_node=1", "algorithm.adv_estimator=gae",
                   "critic_pool.nnodes=1", "critic_pool.n_gpus_per_node=1")
    with pytest.raises(PreflightError, match=r"1 on critic_pool ask 2 GPUs but the local cluster has 1"):
        preflight.check_devices(gpus, cuda_devices=1)
    external = _config(tmp_path, "trainer.ray_init.num_cpus=null", "actor_rollout_ref.rollout.mode=server",
                       "actor_rollout_ref.rollout.server.address=[http://127.0.0.1:8000]")
    preflight.check_devices(external, cuda_devices=0)  # servers the user started take no slot here


def test_a_server_next_to_the_trainer_on_one_gpu_asks_one_gpu_and_the_error_says_how(tmp_path):
    own = _config(tmp_path, "trainer.device=cuda", "trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.mode=server")
    with pytest.raises(PreflightError, match=r"ask 2 GPUs but the local cluster has 1.*rollout_pool.gpu_fraction=0.5"):
        preflight.check_devices(own, cuda_devices=1)
    shared = _config(tmp_path, "trainer.device=cuda", "trainer.n_gpus_per_node=1",
                     "actor_rollout_ref.rollout.mode=server", "rollout_pool.gpu_fraction=0.5")
    preflight.check_devices(shared, cuda_devices=1)


def test_workers_beyond_the_counted_cpus_name_cpus_per_worker(tmp_path, monkeypatch):
    monkeypatch.setattr(preflight.os, "cpu_count", lambda: 2)
    config = _config(tmp_path, "trainer.ray_init.num_cpus=null", "trainer.cpus_per_worker=2")
    with pytest.raises(PreflightError, match=r"need 4 logical CPUs but this machine has 2.*trainer.ray_init.num_cpus"):
        preflight.check_devices(config, cuda_devices=0)


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed here")
def test_wandb_logger_without_the_package_names_the_install(tmp_path):
    config = _config(tmp_path, "trainer.logger=[console,wandb]")
    expected = r"trainer.logger contains 'wandb' but the 'wandb' package is not installed"
    with pytest.raises(PreflightError, match=expected):
        run_preflight(config, joining_cluster=False)


def test_csv_data_file_is_refused_by_its_suffix(tmp_path):
    data = tmp_path / "train.csv"
    data.write_text("prompt,answer\n")
    expected = r"data.train_files: .*train.csv' is a .csv file; verl_like reads .parquet"
    with pytest.raises(ConfigError, match=expected):  # validate refuses it, with the config's other problems
        _config(tmp_path, f"data.train_files=[{data}]")


def _jsonl(tmp_path, data_source):
    path = tmp_path / "train.jsonl"
    rows = [{"data_source": data_source, "prompt": [{"role": "user", "content": f"q{i}"}],
             "reward_model": {"ground_truth": "1"}} for i in range(8)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_data_source_without_a_scorer_is_refused_unless_a_custom_function_scores_it(tmp_path):
    data = _jsonl(tmp_path, "my/unscored")
    config = _config(tmp_path, f"data.train_files=[{data}]")
    with pytest.raises(PreflightError, match=r"data_source \['my/unscored'\].*set custom_reward_function.path"):
        run_preflight(config, joining_cluster=False)
    run_preflight(config, joining_cluster=False, reward_fn=lambda **kw: 1.0)
    scorer = tmp_path / "scorer.py"
    scorer.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    run_preflight(_config(tmp_path, f"data.train_files=[{data}]", f"custom_reward_function.path={scorer}"),
                  joining_cluster=False)


def test_run_dir_under_a_regular_file_is_refused(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    config = load_config(["+trainer=ci_smoke", f"trainer.default_local_dir={blocker / 'run'}"])
    expected = r"trainer.default_local_dir=.*a_file/run' cannot be created: .*a_file is a file"
    with pytest.raises(PreflightError, match=expected):
        run_preflight(config, joining_cluster=False)


def test_unwritable_run_dir_is_refused(tmp_path):
    # /sys refuses new folders even to root (a chmod'ed folder would not stop root, which runs CI here).
    config = load_config(["+trainer=ci_smoke", "trainer.default_local_dir=/sys/verl_like_run"])
    expected = r"trainer.default_local_dir='/sys/verl_like_run' is not writable \(Permission"
    with pytest.raises(PreflightError, match=expected):
        run_preflight(config, joining_cluster=False)


def test_checkpoint_larger_than_the_free_space_is_refused(tmp_path, monkeypatch):
    config = _config(tmp_path, "trainer.save_freq=1")
    monkeypatch.setattr(preflight, "checkpoint_size_estimate", lambda config: 10 * 2**30)
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda path: type("Usage", (), {"free": 2**30})())
    with pytest.raises(PreflightError, match=r"1.0 GiB free but one checkpoint needs about 10.0 GiB.*save_freq=-1"):
        preflight.check_run_dir(config)
    preflight.check_run_dir(_config(tmp_path, "trainer.save_freq=-1"))


def test_checkpoint_estimate_is_three_times_the_weight_files(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"\0" * 1000)
    config = load_config(["+trainer=ci_smoke", f"actor_rollout_ref.model.path={model}"], check_paths=False)
    assert preflight.checkpoint_size_estimate(config) == 3000
    assert preflight.checkpoint_size_estimate(_config(tmp_path)) is None  # the builtin model is built at run time


def test_busy_dashboard_port_is_refused(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = _config(tmp_path, "trainer.ray_init.include_dashboard=true", f"trainer.ray_init.dashboard_port={port}")
        with pytest.raises(PreflightError, match=rf"trainer.ray_init.dashboard_port={port} on 127.0.0.1 is not free"):
            run_preflight(config, joining_cluster=False)


def test_megatron_needs_megatron_core_importable_and_fsdp2_does_not(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    present = {"megatron.core": False}

    def find_spec(name, *args):
        if name == "megatron.core":
            return object() if present[name] else None
        return real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    megatron = _config(tmp_path, "actor_rollout_ref.actor.strategy=megatron")
    with pytest.raises(PreflightError, match=r"actor_rollout_ref.actor.strategy=megatron needs megatron-core"):
        preflight.check_training_backends(megatron)
    preflight.check_training_backends(_config(tmp_path))  # fsdp2 needs no megatron-core
    present["megatron.core"] = True
    preflight.check_training_backends(megatron)


def _package(root, name):
    package = root / name
    package.mkdir()
    (package / "__init__.py").write_text("VALUE = 1\n")
    return package


def test_packages_without_bytecode_are_named_with_the_compile_command(tmp_path, monkeypatch, caplog):
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    bare, compiled = _package(tmp_path, "vl_bare_pkg"), _package(tmp_path, "vl_compiled_pkg")
    assert compileall.compile_dir(str(compiled), quiet=1)
    assert preflight.uncompiled_packages(("vl_bare_pkg", "vl_compiled_pkg", "no_such_pkg_here")) == [bare]
    with caplog.at_level(logging.WARNING, logger=preflight.__name__):
        preflight.warn_uncompiled_packages(("vl_bare_pkg", "vl_compiled_pkg"))
    (record,) = caplog.records
    assert "no compiled bytecode for vl_bare_pkg," in record.getMessage()
    assert f"-m compileall -q -j 0 {bare}" in record.getMessage()
    # where Python may write the cache itself, the first process does so and the rest read it
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    assert preflight.uncompiled_packages(("vl_bare_pkg",)) == []
