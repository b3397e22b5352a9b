"""The rollout-backend registry: lookup, the missing-package error at validation (found with find_spec, never
imported), what an entry's capabilities refuse, and a user's backend as one more entry."""

from __future__ import annotations

import importlib.util

import pytest

from verl_like.config import ConfigError
from verl_like.config.loader import load_config
from verl_like.config.rollout import RolloutConfig
from verl_like.config.rollout_backends import (
    INSTALL_CPU,
    INSTALL_GPU,
    ROLLOUT_BACKENDS,
    RolloutBackend,
    check_rollout_package,
    register_rollout_backend,
    rollout_backend,
)
from verl_like.config.verl_compat import translate_overrides


@pytest.fixture
def without_vllm(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))


@pytest.fixture
def mine():
    """A user's backend, registered for the test and removed after it."""
    built = []

    def options(build):
        return {"dtype": build.rollout.dtype, "lora_rank": build.lora_rank}

    def builder(model_path, opts):
        built.append((model_path, opts))
        return "my engine"

    backend = register_rollout_backend(RolloutBackend("mine", "my engine", builder=builder, options=options,
                                                      package="json"))
    yield backend, built
    del ROLLOUT_BACKENDS["mine"]


def test_the_builtin_entries_say_what_each_backend_supports():
    vllm, hf = rollout_backend("vllm"), rollout_backend("hf")
    assert vllm.package == "vllm" and vllm.supports_servers and vllm.slice_loading and vllm.images
    assert hf.package is None and not hf.supports_servers and not hf.slice_loading and hf.max_tp_size == 1


def test_an_unknown_name_is_refused_naming_the_key_and_the_closest_entry():
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.rollout.name='vlm' is not a registered rollout "
                                          r"backend; did you mean 'vllm'\? valid names: hf, vllm"):
        rollout_backend("vlm")


def test_a_missing_package_names_the_key_and_the_install_command_of_the_device(without_vllm):
    with pytest.raises(ConfigError) as cpu:
        check_rollout_package("vllm", "cpu")
    message = str(cpu.value)
    assert message.startswith("actor_rollout_ref.rollout.name=vllm needs vllm")
    assert INSTALL_CPU in message and INSTALL_GPU not in message and "actor_rollout_ref.rollout.name=hf" in message
    with pytest.raises(ConfigError) as auto:
        check_rollout_package("vllm", "auto")  # the device is not known yet: both commands
    assert INSTALL_CPU in str(auto.value) and INSTALL_GPU in str(auto.value)
    check_rollout_package("hf", "cpu")  # the HF rollout needs nothing beyond verl_like's own packages


def test_validation_refuses_a_backend_whose_package_is_missing_before_anything_starts(without_vllm):
    with pytest.raises(ConfigError, match="actor_rollout_ref.rollout.name=vllm needs vllm"):
        load_config([])
    load_config(["actor_rollout_ref.rollout.name=hf"])
    load_config([], check_paths=False)  # a config checked for another machine: its packages are not ours


def test_the_package_check_finds_without_importing(monkeypatch):
    imported = []
    real_import = __import__

    def spy(name, *args, **kwargs):
        imported.append(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr("builtins.__import__", spy)
    assert rollout_backend("vllm").package_installed()
    assert "vllm" not in imported


def test_capabilities_refuse_what_the_backend_cannot_do():
    with pytest.raises(ConfigError, match=r"mode=server needs a backend with servers, and "
                                          r"actor_rollout_ref.rollout.name='hf' \(HF generate\) has none; set "
                                          r"actor_rollout_ref.rollout.name=vllm"):
        RolloutConfig(mode="server", name="hf")
    with pytest.raises(ConfigError, match="name='hf' runs without tensor parallelism"):
        RolloutConfig(name="hf", tensor_model_parallel_size=2)


def test_a_users_backend_is_one_more_entry(mine):
    from verl_like.rollout.backends import EngineBuild, build_rollout_engine, server_backend

    backend, built = mine
    config = RolloutConfig(name="mine", tensor_model_parallel_size=4)  # no TP limit declared
    engine = build_rollout_engine(EngineBuild("/models/p", config, hf_config=None, lora_rank=8))
    assert engine == "my engine" and built == [("/models/p", {"dtype": config.dtype, "lora_rank": 8})]
    with pytest.raises(ConfigError, match="name='mine' \\(my engine\\) has none"):
        RolloutConfig(name="mine", mode="server")
    with pytest.raises(ConfigError, match="has no server mode"):
        server_backend("mine")
    check_rollout_package("mine", "cpu")  # json is there


def test_the_vllm_entry_resolves_to_the_vllm_server_backend():
    from verl_like.rollout.backends import resolve, server_backend
    from verl_like.rollout.vllm_server import VLLM_SERVER

    assert server_backend("vllm") is VLLM_SERVER
    assert resolve("verl_like.rollout.hf:build_hf_engine").__name__ == "build_hf_engine"


def test_verls_sglang_is_refused_until_someone_registers_it():
    with pytest.raises(ConfigError, match="rollout.name=sglang is not supported"):
        translate_overrides(["actor_rollout_ref.rollout.name=sglang"])
    register_rollout_backend(RolloutBackend("sglang", "SGLang", builder="x:y", options="x:z"))
    try:
        key = "actor_rollout_ref.rollout.name=sglang"
        assert key in translate_overrides([key])[0]
    finally:
        del ROLLOUT_BACKENDS["sglang"]


def test_servers_without_adapter_routes_serve_a_lora_policy_merged():
    register_rollout_backend(RolloutBackend("plain", "Plain", builder="x:y", options="x:z", server="x:s"))
    try:
        lora = ["actor_rollout_ref.rollout.mode=server", "actor_rollout_ref.model.lora_rank=8",
                "actor_rollout_ref.rollout.name=plain", "trainer.device=cpu"]
        with pytest.raises(ConfigError, match="Plain.s servers take no adapters over HTTP"):
            load_config(lora)
        load_config([*lora, "actor_rollout_ref.model.lora.merge=true"])
    finally:
        del ROLLOUT_BACKENDS["plain"]
