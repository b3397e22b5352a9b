"""HF hub ids as model paths resolve through a local HF cache ($HF_HOME), offline; a missing one names the fix."""

from __future__ import annotations

import pytest

from verl_like.config.errors import ConfigError
from verl_like.config.loader import load_config
from verl_like.models.tiny import build_tiny_model
from verl_like.utils.hub import is_hub_id, resolve_hub_model

REVISION = "0123456789abcdef0123456789abcdef01234567"


def _hf_cache_with(home, repo_id: str):
    """The layout huggingface_hub writes: hub/models--org--name/{refs/main, snapshots/<revision>/...}."""
    repo = home / "hub" / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(REVISION)
    return build_tiny_model(repo / "snapshots" / REVISION)


def test_a_hub_id_resolves_to_its_cached_snapshot_offline(tmp_path, monkeypatch):
    snapshot = _hf_cache_with(tmp_path / "hf", "Qwen/Qwen2.5-0.5B-Instruct")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_hub_model("Qwen/Qwen2.5-0.5B-Instruct") == str(snapshot)
    config = load_config(["actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct", "data.max_prompt_length=16",
                          "data.max_response_length=16"])
    assert config.actor_rollout_ref.model.path == str(snapshot)


def test_a_hub_id_missing_from_the_cache_names_the_download_command(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="huggingface-cli download Qwen/Qwen2.5-7B-Instruct"):
        load_config(["actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct"])


def test_local_paths_and_the_builtin_model_are_not_hub_ids(tmp_path):
    assert not is_hub_id("tiny") and not is_hub_id("/models/qwen") and not is_hub_id(str(tmp_path))
    assert is_hub_id("Qwen/Qwen2.5-0.5B-Instruct")
