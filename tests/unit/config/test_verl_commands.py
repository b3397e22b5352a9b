"""verl's command lines compose as verl runs them: its value forms, deprecated and performance keys, and its
defaults under a command that names its own data or model."""

from __future__ import annotations

import pytest

from verl_like.config.errors import ConfigError
from verl_like.config.loader import load_config
from verl_like.config.verl_compat import translate_overrides

# verl's PPO quick start (docs/start/quickstart.rst) and GRPO example (examples/grpo_trainer/run_qwen2-7b.sh).
PPO_QUICKSTART = [
    "data.train_files=/data/gsm8k/train.parquet", "data.val_files=/data/gsm8k/test.parquet",
    "data.train_batch_size=256", "data.max_prompt_length=512", "data.max_response_length=256",
    "actor_rollout_ref.model.path=/models/qwen", "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.ppo_mini_batch_size=64", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4", "critic.optim.lr=1e-5",
    "critic.model.path=/models/qwen", "critic.ppo_micro_batch_size_per_gpu=4", "algorithm.kl_ctrl.kl_coef=0.001",
    "trainer.logger=console", "trainer.val_before_train=False", "trainer.n_gpus_per_node=1", "trainer.nnodes=1",
    "trainer.save_freq=10", "trainer.test_freq=10", "trainer.total_epochs=15",
]
GRPO_EXAMPLE = [
    "algorithm.adv_estimator=grpo", "data.train_files=/data/gsm8k/train.parquet",
    "data.val_files=/data/gsm8k/test.parquet", "data.train_batch_size=1024", "data.max_prompt_length=512",
    "data.max_response_length=1024", "data.filter_overlong_prompts=True", "data.truncation='error'",
    "actor_rollout_ref.model.path=/models/qwen", "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True", "actor_rollout_ref.actor.ppo_mini_batch_size=256",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40", "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0", "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40", "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "algorithm.use_kl_in_reward=False", "trainer.critic_warmup=0", 'trainer.logger=["console","wandb"]',
    "trainer.project_name=verl_grpo_example_gsm8k", "trainer.experiment_name=qwen2_7b_function_rm",
    "trainer.n_gpus_per_node=8", "trainer.nnodes=1", "trainer.save_freq=20", "trainer.test_freq=5",
    "trainer.total_epochs=15", "trainer.ray_init.num_cpus=8",
]


def test_ppo_quickstart_composes_to_gae_with_its_critic_and_its_epochs():
    config = load_config(PPO_QUICKSTART, check_paths=False)
    assert config.algorithm.adv_estimator == "gae" and config.derived.use_critic
    assert config.critic.model.path == "/models/qwen"
    assert config.actor_rollout_ref.rollout.n == 1
    assert config.trainer.total_epochs == 15 and config.trainer.total_training_steps is None
    assert config.trainer.logger == ("console",)


def test_grpo_example_composes_to_grpo_with_its_group_size_and_kl_loss():
    config = load_config(GRPO_EXAMPLE, check_paths=False)
    assert config.algorithm.adv_estimator == "grpo" and not config.derived.use_critic
    assert config.actor_rollout_ref.rollout.n == 5 and config.actor_rollout_ref.actor.use_kl_loss
    assert config.trainer.total_epochs == 15 and config.trainer.total_training_steps is None
    assert config.trainer.logger == ("console", "wandb")


def test_no_arguments_run_the_embedded_default_task_also_as_a_preset():
    for overrides in ([], ["+trainer=default_task"]):
        config = load_config(overrides, check_paths=False)
        assert config.algorithm.adv_estimator == "grpo" and config.actor_rollout_ref.model.path == "tiny"
    demo_with_data = load_config(["+trainer=default_task", "data.train_files=/x.parquet"], check_paths=False)
    assert demo_with_data.actor_rollout_ref.rollout.n == 8  # the preset keeps the demo's defaults
    other_task = load_config(["data.train_files=synthetic:add", "actor_rollout_ref.model.path=tiny"], check_paths=False)
    assert other_task.actor_rollout_ref.rollout.n == 8  # the demo's own tasks and model are not "a job of its own"


def test_verl_value_forms_and_accepted_keys_translate():
    out, notes = translate_overrides([
        "trainer.default_hdfs_dir=null",
        "actor_rollout_ref.actor.optim.warmup_style=cosine", "actor_rollout_ref.actor.use_torch_compile=False",
        "actor_rollout_ref.rollout.enable_chunked_prefill=True", "data.dataloader_num_workers=8",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=1", "trainer.logger=console",
    ])
    assert out == ["actor_rollout_ref.actor.optim.lr_scheduler_type=cosine", "trainer.logger=[console]"]
    assert any("deprecated" in note for note in notes) and any("eagerly" in note for note in notes)


@pytest.mark.parametrize("override, message", [
    ("trainer.default_hdfs_dir=/hdfs/ckpt", "trainer.default_local_dir"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
    ("actor_rollout_ref.actor.use_torch_compile=True", "runs eagerly"),
    ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", "not built"),
])
def test_verl_keys_that_cannot_be_honoured_are_refused_with_the_reason(override, message):
    with pytest.raises(ConfigError, match=message):
        translate_overrides([override])


def test_unknown_key_hint_compares_names_not_shared_prefixes():
    with pytest.raises(ConfigError) as err:
        load_config(["actor_rollout_ref.actor.use_torch_compilation=false"], check_paths=False)
    assert "entropy_coeff'?" not in str(err.value)
    with pytest.raises(ConfigError, match="did you mean 'actor_rollout_ref.actor.entropy_coeff'"):
        load_config(["actor_rollout_ref.actor.entropy_coef=0"], check_paths=False)


def test_verl_defaults_train_and_roll_out_in_bf16_on_eight_gpus_when_cuda_is_present():
    from verl_like.config.verl_compat import verl_default_layer

    job = ["actor_rollout_ref.model.path=/m", "data.val_files=/v.parquet"]
    gpu = verl_default_layer(job, cuda=True)
    assert gpu[0] == "+trainer=verl" and "actor_rollout_ref.rollout.dtype=bfloat16" in gpu
    assert "trainer.n_gpus_per_node=8" in gpu and gpu[-1] == "trainer.val_before_train=true"
    assert verl_default_layer(job, cuda=False) == ["+trainer=verl", "trainer.val_before_train=true"]
    assert verl_default_layer(["+trainer=ci_smoke", *job], cuda=True) == []  # a preset keeps its own defaults
    config = load_config([*gpu, *job], check_paths=False)
    assert config.actor_rollout_ref.actor.fsdp_config.param_dtype == "bfloat16"


def test_deprecated_global_micro_batch_sizes_are_divided_by_the_jobs_gpus_as_verl_does():
    out, notes = translate_overrides(["actor_rollout_ref.actor.ppo_micro_batch_size=16",
                                      "actor_rollout_ref.rollout.log_prob_micro_batch_size=32",
                                      "trainer.n_gpus_per_node=4", "trainer.nnodes=2"])
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2" in out
    assert "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4" in out
    assert any("divided by the job's 8 GPUs" in note for note in notes)
    with pytest.raises(ConfigError, match="fewer than the job's 8 GPUs"):
        translate_overrides(["actor_rollout_ref.actor.ppo_micro_batch_size=4", "trainer.n_gpus_per_node=8"])
    with pytest.raises(ConfigError, match="or set trainer.n_gpus_per_node"):
        translate_overrides(["critic.ppo_micro_batch_size=4"])


def test_verl_nested_lora_keys_and_use_shm_are_read():
    out, notes = translate_overrides(["actor_rollout_ref.model.lora.rank=16", "actor_rollout_ref.model.lora.alpha=32",
                                      "actor_rollout_ref.model.use_shm=True"])
    assert out == ["actor_rollout_ref.model.lora_rank=16", "actor_rollout_ref.model.lora_alpha=32"]
    assert any(note.startswith("actor_rollout_ref.model.use_shm=True: ignored") for note in notes)


def test_a_users_config_file_on_ppo_trainer_is_read_before_the_command_line(tmp_path):
    """verl's multi-turn examples: --config-path=DIR --config-name=NAME with NAME.yaml = [ppo_trainer, _self_]."""
    (tmp_path / "multiturn.yaml").write_text(
        "hydra:\n  searchpath:\n    - file://verl/trainer/config\ndefaults:\n  - ppo_trainer\n  - _self_\n"
        "data:\n  max_prompt_length: 1024\n  return_raw_chat: True\n"
        "actor_rollout_ref:\n  rollout:\n    name: vllm\n    multi_turn:\n      enable: True\n"
        "      max_assistant_turns: 5\n      tool_config_path: \"./tools with space.yaml\"\n")
    out, notes = translate_overrides([f"--config-path={tmp_path}", "--config-name=multiturn",
                                      "data.max_prompt_length=512"])
    assert out[:5] == ["data.max_prompt_length=1024", "data.return_raw_chat=true", "actor_rollout_ref.rollout.name=vllm",
                       "actor_rollout_ref.rollout.multi_turn.enable=true",
                       "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5"]
    assert out[-1] == "data.max_prompt_length=512"  # the command line wins, as in Hydra
    assert any("multiturn.yaml read as 6 overrides on ppo_trainer" in note for note in notes)
    config = load_config([*[f"--config-path={tmp_path}", "--config-name=multiturn"],
                          "actor_rollout_ref.rollout.multi_turn.tool_config_path=null",
                          "data.max_prompt_length=256"], check_paths=False)
    assert config.data.max_prompt_length == 256 and config.actor_rollout_ref.rollout.multi_turn.enable
    (tmp_path / "other.yaml").write_text("defaults:\n  - sft_trainer\n  - _self_\n")
    with pytest.raises(ConfigError, match="builds on \\['sft_trainer'\\]"):
        translate_overrides([f"--config-path={tmp_path}", "--config-name=other"])
    with pytest.raises(ConfigError, match="no missing.yaml built on it was found"):
        translate_overrides([f"--config-path={tmp_path}", "--config-name=missing"])
