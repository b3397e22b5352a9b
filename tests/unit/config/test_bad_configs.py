"""Each bad config fails before anything starts, with one message naming the key(s) and the fix."""

from __future__ import annotations

import pytest

from verl_like.config import ConfigError, load_config

# (overrides, substring the message must contain). "{tmp}" is replaced by a fresh empty directory.
BAD_CONFIGS = [
    # unknown keys: the full dotted key and the closest valid one
    (["data.trian_batch_size=8"], "unknown config key 'data.trian_batch_size'; did you mean 'data.train_batch_size'?"),
    (["+actor_rollout_ref.actor.ppo_micro_batch_size=4"],
     "deprecated global micro-batch size and actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu is set too"),
    (["+actor_rollout_ref.rollout.use_kl_loss=true"],
     "unknown config key 'actor_rollout_ref.rollout.use_kl_loss'; did you mean 'actor_rollout_ref.actor.use_kl_loss'?"),
    (["+actor_rollout_ref.model.tiny_spec.hidden=64"],
     "unknown config key 'actor_rollout_ref.model.tiny_spec.hidden'; TinyModelSpec fields are"),
    (["+trainer=gsm8k_grpo"], "no preset configs/trainer/gsm8k_grpo.yaml; did you mean"),
    (["actor_rollout_ref.rollout.sleep_level=3"],
     "actor_rollout_ref.rollout.sleep_level=3 must be 1 (offload weights) or 2 (discard them)"),
    # wrong types: key, value and expected type
    (["data.train_batch_size=abc"], "data.train_batch_size='abc' has the wrong type: expected int, got str"),
    (["actor_rollout_ref.actor.use_kl_loss=maybe"], "actor_rollout_ref.actor.use_kl_loss='maybe' has the wrong type: "
                                                     "expected bool"),
    (["trainer.logger=[console,nope]"], "trainer.logger contains 'nope'"),
    (["actor_rollout_ref.actor.optim.lr=fast"], "actor_rollout_ref.actor.optim.lr='fast' has the wrong type: "
                                                "expected float"),
    (["data.train_files=???"], "data.train_files is required but left at '???'"),
    # choices and registered names
    (["algorithm.adv_estimator=grop"],
     "algorithm.adv_estimator='grop' is not a registered advantage estimator; did you mean 'grpo'?"),
    (["actor_rollout_ref.actor.policy_loss.loss_mode=ppo2"],
     "actor_rollout_ref.actor.policy_loss.loss_mode='ppo2' is not registered"),
    (["algorithm.kl_penalty=k9"], "algorithm.kl_penalty='k9' is not a registered KL estimator"),
    (["trainer.logger=[console,neptune]"], "trainer.logger contains 'neptune'"),
    (["trainer.device=tpu"], "trainer.device='tpu' must be one of"),
    (["trainer.resume_mode=always"], "trainer.resume_mode='always' must be one of"),
    (["trainer.rollout_data_dir=5"], "trainer.rollout_data_dir=5 has the wrong type: expected str or null"),
    (["trainer.rollout_data_dir=''"], "trainer.rollout_data_dir='' must be a folder path, or null"),
    (["actor_rollout_ref.rollout.name=sglang"], "actor_rollout_ref.rollout.name=sglang is not supported: SGLang"),
    (["data.truncation=cut"], "data.truncation='cut' is not one of"),
    (["reward_model.reward_manager=batch"], "reward_model.reward_manager=batch is not supported"),
    (["data.train_files=synthetic:mul"], "data.train_files: unknown synthetic task 'mul'"),
    # ranges
    (["data.max_response_length=-1"], "data.max_response_length=-1 must be >= 1"),
    (["data.max_prompt_length=0"], "data.max_prompt_length=0 must be >= 1"),
    (["trainer.save_freq=0"], "trainer.save_freq=0 must be >= 1 (every N steps) or -1 (never)"),
    (["algorithm.rollout_is_threshold=0.5"], "algorithm.rollout_is_threshold=0.5 must be > 1"),
    (["algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.target_kl=0"],
     "algorithm.kl_ctrl.target_kl=0.0 must be > 0"),
    (["actor_rollout_ref.hybrid_engine=false"], "actor_rollout_ref.hybrid_engine=false (rollout on its own workers) "
                                                "is not supported"),
    (["+actor_rollout_ref.model.tiny_spec.hidden_size=100"], "actor_rollout_ref.model.tiny_spec: hidden_size=100"),
    # batch sizes that do not divide
    (["data.train_batch_size=30"],
     "data.train_batch_size=30 is not divisible by actor_rollout_ref.actor.ppo_mini_batch_size=16"),
    (["actor_rollout_ref.actor.ppo_mini_batch_size=64"],
     "actor_rollout_ref.actor.ppo_mini_batch_size=64 is larger than data.train_batch_size=32"),
    (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=24"],
     "is not divisible by data-parallel size 2 x actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=24"),
    (["trainer.n_gpus_per_node=3"], "64 samples is not divisible by the data-parallel size 3"),
    (["actor_rollout_ref.rollout.tensor_model_parallel_size=4"],
     "actor_rollout_ref.rollout.tensor_model_parallel_size=4 does not divide the 2 ranks"),
    (["algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=24"],
     "x critic.ppo_micro_batch_size_per_gpu=24"),
    # lengths across nodes
    (["data.max_prompt_length=400", "data.max_response_length=200"],
     "= 600 exceeds the model's max_position_embeddings=512"),
    (["actor_rollout_ref.rollout.response_length=8"],
     "actor_rollout_ref.rollout.response_length=8 differs from data.max_response_length=16"),
    (["reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=64"],
     "reward_model.overlong_buffer.len=64 exceeds data.max_response_length=16"),
    # roles
    (["algorithm.adv_estimator=gae", "critic.enable=false"], "algorithm.adv_estimator='gae' needs a critic"),
    (["actor_rollout_ref.rollout.n=1"], "gives every advantage 0; set actor_rollout_ref.rollout.n >= 2"),
    (["algorithm.adv_estimator=reinforce_plus_plus", "actor_rollout_ref.rollout.n=1",
      "algorithm.filter_groups.enable=true"], "algorithm.filter_groups.enable=true keeps groups whose samples differ"),
    (["trainer.critic_warmup=5"], "trainer.critic_warmup=5 needs a critic"),
    (["reward_model.enable=true"], "reward_model.enable=true needs reward_model.model.path"),
    # schedule, cluster
    (["data.val_files=[]"], "ask for validation but data.val_files is empty"),
    (["trainer.resume_mode=resume_path"], "trainer.resume_mode='resume_path' needs trainer.resume_from_path"),
    (["trainer.resume_from_path=/ckpt/global_step_5"], "trainer.resume_from_path is set but trainer.resume_mode='auto'"),
    (["trainer.nnodes=2"], "trainer.nnodes=2 needs a running multi-node Ray cluster"),
    (["trainer.ray_init.num_cpus=1"],
     "trainer.ray_init.num_cpus=1 cannot place 2 processes (trainer.nnodes x trainer.n_gpus_per_node = 2 trainer"),
    # paths
    (["actor_rollout_ref.model.path=/nonexistent/model"],
     "actor_rollout_ref.model.path='/nonexistent/model': no such directory"),
    (["actor_rollout_ref.model.path={tmp}"], "has no config.json"),
    (["data.train_files=/nonexistent/train.parquet"], "data.train_files: '/nonexistent/train.parquet' does not exist"),
    (["custom_reward_function.path=/nonexistent/reward.py"],
     "custom_reward_function.path='/nonexistent/reward.py' does not exist"),
    (["custom_reward_function.path=reward.txt"], "custom_reward_function.path='reward.txt' must be a Python file"),
    (["trainer.resume_mode=resume_path", "trainer.resume_from_path=/nonexistent/global_step_5"],
     "trainer.resume_from_path='/nonexistent/global_step_5': no such directory"),
]


# The messages above were written against these sizes (the default job's earlier shape); pinning them keeps the
# cases independent of how the embedded default is tuned.
BASE = ["data.train_batch_size=32", "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16", "actor_rollout_ref.rollout.n=4",
        "data.max_prompt_length=32", "data.max_response_length=16"]


@pytest.mark.parametrize(("overrides", "message"), BAD_CONFIGS, ids=[" ".join(o) for o, _ in BAD_CONFIGS])
def test_bad_config_fails_with_its_message(overrides, message, tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    overrides = [o.replace("{tmp}", str(tmp_path)) for o in overrides]
    with pytest.raises(ConfigError) as excinfo:
        load_config(BASE + overrides)
    assert message in str(excinfo.value)


def test_there_are_at_least_twenty_distinct_bad_configs():
    assert len({message for _, message in BAD_CONFIGS}) >= 20


def test_path_errors_are_skipped_without_path_checks():
    config = load_config(["actor_rollout_ref.model.path=/nonexistent/model",
                          "data.train_files=/nonexistent/train.parquet"], check_paths=False)
    assert config.actor_rollout_ref.model.path == "/nonexistent/model"


def test_several_config_errors_are_reported_at_once(tmp_path):
    """Issue #31: `data.train_files=x.csv` with lengths over the model's context was reported as the context length
    alone; every problem is named in one error."""
    data = tmp_path / "x.csv"
    data.write_text("prompt\n1+1\n")
    with pytest.raises(ConfigError) as excinfo:
        load_config([*BASE, f"data.train_files={data}", "data.max_prompt_length=1000", "data.train_batch_size=30",
                     "trainer.n_gpus_per_node=3"])
    message = str(excinfo.value)
    assert message.startswith("3 problems with the config:\n- "), message
    assert "x.csv' is a .csv file" in message and "exceeds the model's max_position_embeddings" in message
    assert "data.train_batch_size=30 is not divisible by actor_rollout_ref.actor.ppo_mini_batch_size=16" in message


def test_a_single_config_error_is_its_own_message():
    with pytest.raises(ConfigError) as excinfo:
        load_config([*BASE, "data.max_prompt_length=1000"])
    assert str(excinfo.value).startswith("data.max_prompt_length=1000 + data.max_response_length=16")
