"""compose_config / to_typed / validate: presets, dotted overrides, interpolation, derived sizes, frozen objects.

GPU presets name model and data paths that do not exist on a CI machine, so they are validated with
`check_paths=False` (every check except file existence and reading the model's config.json).
"""

from __future__ import annotations

import dataclasses
import json
import pickle
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from verl_like.config import ConfigError, PPOConfig, compose_config, list_presets, load_config, to_typed, validate
from verl_like.config.convert import FrozenDict, valid_keys
from verl_like.config.loader import DEFAULT_CONFIG_DIR
from verl_like.rollout.from_config import vllm_engine_options

PRESETS = list_presets()
FREE_FORM = ("actor_rollout_ref.model.tiny_spec", "actor_rollout_ref.model.override_config",
             "critic.model.override_config")


def _flat_keys(node, prefix=""):
    keys = []
    for key, value in node.items():
        full = f"{prefix}{key}"
        keys.append(full)
        if isinstance(value, dict) and full not in FREE_FORM:
            keys.extend(_flat_keys(value, full + "."))
    return keys


def test_presets_listed():
    assert set(PRESETS) >= {
        "gsm8k_grpo_qwen2_5_0_5b", "gsm8k_grpo_qwen2_5_1_5b", "gsm8k_grpo_qwen2_5_7b", "ppo_critic", "rloo",
        "reinforce_plus_plus", "dapo", "ci_smoke",
    }


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_composes_converts_and_validates(preset):
    text = (DEFAULT_CONFIG_DIR / "trainer" / f"{preset}.yaml").read_text().splitlines()
    assert text[0] == "# @package _global_"
    assert text[1].startswith("# ") and len(text[1]) > 20, "a preset starts with a comment saying what it is for"
    # verl's defaults (prompt + response 1024) need a model of its own: the tiny builtin one holds 512 positions.
    model = ["actor_rollout_ref.model.path=/models/any"] if preset == "verl" else []
    config = to_typed(compose_config([f"+trainer={preset}", *model]))
    assert isinstance(config, PPOConfig)
    validate(config, check_paths=False)
    assert config.derived.samples_per_step == config.data.train_batch_size * config.actor_rollout_ref.rollout.n


def test_default_job_validates_with_paths_checked():
    config = load_config([])  # tiny builtin model and synthetic data: nothing on disk is needed
    assert config.actor_rollout_ref.model.path == "tiny"
    assert config.data.train_files == ("synthetic:sort",) and config.data.val_files == ("synthetic:sort:test",)
    assert config.algorithm.adv_estimator == "grpo"
    assert config.actor_rollout_ref.rollout.name == "vllm"
    assert (config.trainer.device, config.trainer.n_gpus_per_node, config.trainer.nnodes) == ("cpu", 2, 1)
    assert not config.derived.use_critic


def test_ci_smoke_validates_with_paths_checked():
    config = load_config(["+trainer=ci_smoke"])
    assert config.trainer.total_training_steps == 2
    assert config.actor_rollout_ref.model.path == "tiny"


def test_default_yaml_sets_every_key_of_the_schema():
    yaml_keys = _flat_keys(OmegaConf.to_container(OmegaConf.load(DEFAULT_CONFIG_DIR / "ppo_trainer.yaml")))
    assert set(yaml_keys) == set(valid_keys(PPOConfig))


def test_dotted_overrides_as_verl_users_type_them():
    config = load_config([
        "data.train_batch_size=64",
        "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "algorithm.adv_estimator=grpo",
        "trainer.n_gpus_per_node=4",
        "actor_rollout_ref.actor.optim.lr=3e-6",
        "trainer.logger=[console,jsonl]",
    ])
    assert config.data.train_batch_size == 64
    assert config.actor_rollout_ref.rollout.n == 8
    assert config.actor_rollout_ref.rollout.tensor_model_parallel_size == 2
    assert config.trainer.n_gpus_per_node == 4
    assert config.actor_rollout_ref.actor.optim.lr == pytest.approx(3e-6)
    assert config.trainer.logger == ("console", "jsonl")
    derived = config.derived
    assert (derived.world_size, derived.rollout_tp_size, derived.rollout_dp_size) == (4, 2, 2)
    assert derived.samples_per_step == 64 * 8


def test_command_line_overrides_win_over_the_preset():
    config = to_typed(compose_config(["+trainer=gsm8k_grpo_qwen2_5_7b", "trainer.n_gpus_per_node=4"]))
    assert config.trainer.n_gpus_per_node == 4
    assert config.actor_rollout_ref.rollout.tensor_model_parallel_size == 2  # from the preset
    assert config.actor_rollout_ref.actor.fsdp_config.param_offload  # from the preset
    assert config.data.max_prompt_length == 512  # from the 0.5B preset it builds on
    validate(config, check_paths=False)
    assert config.derived.rollout_dp_size == 2


def test_interpolations_follow_the_overridden_source_keys():
    config = load_config([
        "data.max_prompt_length=40", "data.max_response_length=24", "actor_rollout_ref.model.use_remove_padding=true",
        "actor_rollout_ref.model.enable_gradient_checkpointing=true", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    ])
    rollout, actor = config.actor_rollout_ref.rollout, config.actor_rollout_ref.actor
    assert (rollout.prompt_length, rollout.response_length) == (40, 24)
    assert actor.use_remove_padding and actor.gradient_checkpointing
    assert config.critic.ppo_micro_batch_size_per_gpu == 8


# Sizes the derived-size cases are written against, independent of the embedded default's tuning.
SIZES = ["data.train_batch_size=32", "actor_rollout_ref.actor.ppo_mini_batch_size=16",
         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16", "actor_rollout_ref.rollout.n=4"]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        # SIZES: 32 prompts, n=4, mini 16 prompts, micro 16 samples, 2 workers
        ([], dict(ppo_mini_batch_size_samples=64, ppo_mini_batch_size_per_rank=32, micro_batches_per_mini_batch=2,
                  mini_batches_per_step=2)),
        (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "trainer.n_gpus_per_node=4",
          "trainer.ray_init.num_cpus=8"],
         dict(ppo_mini_batch_size_samples=64, ppo_mini_batch_size_per_rank=16, micro_batches_per_mini_batch=4)),
        (["actor_rollout_ref.actor.use_dynamic_bsz=true"], dict(micro_batches_per_mini_batch=None)),
        (["algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.n=1", "critic.ppo_micro_batch_size_per_gpu=2",
          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"],
         dict(use_critic=True, ppo_mini_batch_size_samples=16, critic_ppo_mini_batch_size_samples=16,
              critic_ppo_mini_batch_size_per_rank=8, critic_micro_batches_per_mini_batch=4)),
        (["actor_rollout_ref.actor.use_kl_loss=true"], dict(use_reference_policy=True, use_critic=False)),
        (["algorithm.use_kl_in_reward=true"], dict(use_reference_policy=True)),
    ],
)
def test_derived_sizes(overrides, expected):
    derived = load_config(SIZES + overrides).derived
    for key, value in expected.items():
        assert getattr(derived, key) == value, key


def test_derived_values_never_rewrite_the_users_keys():
    config = load_config(SIZES + ["actor_rollout_ref.rollout.n=8"])
    assert config.actor_rollout_ref.actor.ppo_mini_batch_size == 16  # prompts, as typed
    assert config.derived.ppo_mini_batch_size_samples == 16 * 8
    assert config.data.train_batch_size == 32


def test_config_is_frozen_all_the_way_down():
    config = load_config([])
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.data = None  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.data.train_batch_size = 7  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.actor_rollout_ref.actor.optim.lr = 1.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.derived.world_size = 3  # type: ignore[misc]
    assert isinstance(config.trainer.logger, tuple)
    assert isinstance(config.actor_rollout_ref.model.override_config, FrozenDict)
    with pytest.raises(TypeError, match="read-only"):
        config.actor_rollout_ref.model.override_config["x"] = 1  # type: ignore[index]


def test_config_survives_pickling_for_ray():
    config = load_config(["+actor_rollout_ref.model.override_config.attention_dropout=0.0"])
    restored = pickle.loads(pickle.dumps(config))
    assert restored == config
    assert restored.actor_rollout_ref.model.override_config == {"attention_dropout": 0.0}
    assert isinstance(restored.actor_rollout_ref.model.override_config, FrozenDict)
    assert restored.derived == config.derived


def test_to_typed_accepts_a_plain_mapping():
    cfg = OmegaConf.to_container(compose_config([]), resolve=True)
    assert to_typed(cfg) == to_typed(compose_config([]))


def test_warnings_for_double_kl_and_an_unused_critic(caplog):
    config = load_config([])
    assert validate(config) == []
    both = to_typed(compose_config(["algorithm.use_kl_in_reward=true", "actor_rollout_ref.actor.use_kl_loss=true"]))
    with caplog.at_level("WARNING"):
        warnings = validate(both)
    assert len(warnings) == 1 and "counted twice" in warnings[0]
    assert "counted twice" in caplog.text
    unused = to_typed(compose_config(["critic.enable=true"]))
    assert unused.derived.use_critic
    assert any("does not use" in w for w in validate(unused))


def test_compose_inside_a_running_hydra_app_restores_its_state(tmp_path):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    (tmp_path / "other.yaml").write_text("x: 1\n")
    with initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"):
        cfg = compose_config(["data.train_batch_size=8"])
        assert cfg.data.train_batch_size == 8
        assert GlobalHydra.instance().is_initialized()
        assert compose(config_name="other").x == 1  # the outer app's search path is back
    assert not GlobalHydra.instance().is_initialized()


def test_compose_from_another_config_dir(tmp_path, monkeypatch):
    (tmp_path / "trainer").mkdir()
    (tmp_path / "ppo_trainer.yaml").write_text((DEFAULT_CONFIG_DIR / "ppo_trainer.yaml").read_text())
    (tmp_path / "trainer" / "mine.yaml").write_text("# @package _global_\n# my preset\ndata:\n  train_batch_size: 128\n")
    assert load_config(["+trainer=mine"], config_dir=tmp_path).data.train_batch_size == 128
    monkeypatch.setenv("VERL_LIKE_CONFIG_DIR", str(tmp_path))
    assert list_presets() == ["mine"]
    with pytest.raises(ConfigError, match="no ppo_trainer.yaml"):
        compose_config([], config_dir=tmp_path / "trainer")


def _hf_model_dir(root: Path, max_positions: int) -> Path:
    model = root / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2", "max_position_embeddings": max_positions}))
    return model


def test_paths_on_disk_are_accepted_and_the_models_context_is_read(tmp_path):
    model = _hf_model_dir(tmp_path, max_positions=64)
    train, val, reward = tmp_path / "train.parquet", tmp_path / "val.jsonl", tmp_path / "reward.py"
    for path in (train, val, reward):
        path.write_text("")
    overrides = [
        f"actor_rollout_ref.model.path={model}", f"data.train_files=[{train}]", f"data.val_files={val}",
        f"custom_reward_function.path={reward}", "data.max_prompt_length=40", "data.max_response_length=24",
    ]
    config = load_config(overrides)
    assert config.data.train_files == (str(train),) and config.data.val_files == (str(val),)
    with pytest.raises(ConfigError, match=r"= 72 exceeds the model's max_position_embeddings=64"):
        load_config([*overrides, "data.max_prompt_length=48"])
    # Without path checks the model's config.json is not read, so the limit is not known.
    validate(to_typed(compose_config([*overrides, "data.max_prompt_length=48"])), check_paths=False)


def test_docs_list_every_key_and_every_preset():
    docs = (DEFAULT_CONFIG_DIR.parent / "docs" / "config.md").read_text()
    missing = [key for key in valid_keys(PPOConfig) if f"`{key}`" not in docs and not _is_node(key)]
    assert not missing, f"docs/config.md lacks rows for {missing}"
    assert all(f"`+trainer={preset}`" in docs for preset in PRESETS)


def _is_node(key: str) -> bool:
    """Keys whose value is a node (documented by their children's rows)."""
    return any(other.startswith(key + ".") for other in valid_keys(PPOConfig))


def test_sleep_level_reaches_the_vllm_engine_options():
    config = load_config(["actor_rollout_ref.rollout.sleep_level=2"], check_paths=False)
    assert vllm_engine_options(config.actor_rollout_ref.rollout).sleep_level == 2
    assert vllm_engine_options(load_config([], check_paths=False).actor_rollout_ref.rollout).sleep_level == 1
