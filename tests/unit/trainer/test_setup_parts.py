"""trainer/setup.py's parts before any Ray actor starts: build_data (tokenizer, loaders, step count, reward manager)
and role_specs (which roles share the trainer's process, which go to pools of their own)."""

from __future__ import annotations

import pytest

from verl_like.config.loader import load_config
from verl_like.models.tiny import build_tiny_model
from verl_like.trainer.setup import build_data, role_specs


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("setup_parts") / "tiny"))


def _config(model_dir, *overrides):
    return load_config(["+trainer=ci_smoke", f"actor_rollout_ref.model.path={model_dir}", *overrides])


def test_build_data_gives_batches_of_the_configured_size_and_the_step_count(model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_LIKE_CACHE_DIR", str(tmp_path))
    config = _config(model_dir, "trainer.total_training_steps=3")
    data = build_data(config, model_dir)
    try:
        batch = next(iter(data.train_loader))
        assert len(batch) == config.data.train_batch_size == 8
        assert data.total_steps == 3 and data.val_loader is not None
        assert data.tokenizer.pad_token_id is not None
    finally:
        data.reward_manager.close()
    epochs = build_data(_config(model_dir, "trainer.total_training_steps=null", "trainer.total_epochs=2"), model_dir)
    try:
        assert epochs.total_steps == 2 * len(epochs.train_loader)
    finally:
        epochs.reward_manager.close()


def test_role_specs_put_a_colocated_critic_beside_the_actor_and_one_with_its_own_pool_apart(model_dir, tmp_path,
                                                                                            monkeypatch):
    monkeypatch.setenv("VERL_LIKE_CACHE_DIR", str(tmp_path))
    colocated = _config(model_dir, "algorithm.adv_estimator=gae")
    data = build_data(colocated, model_dir)
    try:
        roles, own = role_specs(colocated, model_dir, data)
        assert sorted(roles) == ["actor_rollout", "critic"] and own == {}
        assert roles["actor_rollout"].kwargs["total_training_steps"] == data.total_steps
        assert roles["actor_rollout"].kwargs["ref"] is None  # no KL, no reference
        apart = _config(model_dir, "algorithm.adv_estimator=gae", "critic_pool.nnodes=1",
                        "critic_pool.n_gpus_per_node=1")
        roles, own = role_specs(apart, model_dir, data)
        assert sorted(roles) == ["actor_rollout"] and sorted(own) == ["critic"]
        spec, pool_config = own["critic"]
        assert spec.kwargs["model_path"] == model_dir and pool_config.n_gpus_per_node == 1
    finally:
        data.reward_manager.close()
