"""verl's own example command lines (tests/unit/config/verl_example_commands.py) compose as verl runs them, or are
refused before anything starts naming what is not built; every verl key either reaches the config or is noted."""

from __future__ import annotations

import pytest

import verl_example_commands as verl
from verl_like.config.convert import valid_keys
from verl_like.config.errors import ConfigError
from verl_like.config.loader import load_config
from verl_like.config.ppo import PPOConfig
from verl_like.config.verl_compat import translate_overrides

PATHS = {"data": "/data", "model": "/models/policy", "reward_model": "/models/rm", "run_dir": "/runs/x"}
GPU = ["trainer.device=cuda"]  # the scripts run on GPU machines; validation here is machine-independent
ACCEPTED = ("PPO_GAE_CRITIC", "PPO_MEGATRON", "PPO_REWARD_LOOP", "GRPO", "GRPO_MEGATRON", "RLOO",
            "REINFORCE_PLUS_PLUS", "REMAX", "DAPO")


def command(name: str) -> list[str]:
    return [arg.format(**PATHS) for arg in verl.ALL[name]]


def load(name: str, *extra: str):
    return load_config([*command(name), *GPU, *extra], check_paths=False)


@pytest.mark.parametrize("name", ACCEPTED)
def test_verl_example_composes_and_validates(name):
    config = load(name)
    assert config.actor_rollout_ref.model.path == PATHS["model"]
    assert config.trainer.device == "cuda"


@pytest.mark.parametrize("name", ACCEPTED)
def test_every_verl_key_reaches_the_config_or_is_noted(name):
    """Nothing is accepted silently: each key is one of ours after translation, or a note says what it became."""
    out, notes = translate_overrides(command(name))
    ours = set(valid_keys(PPOConfig))
    out_keys = {o.lstrip("+").partition("=")[0] for o in out}
    for arg in command(name):
        key = arg.lstrip("+").partition("=")[0]
        assert key in out_keys and key in ours or any(note.startswith(key) for note in notes), key


def test_ppo_critic_fsdp_keys_under_critic_model_are_the_critics():
    config = load("PPO_GAE_CRITIC", "critic.model.fsdp_config.param_offload=True")
    assert config.derived.use_critic and config.critic.fsdp_config.param_offload
    assert not config.critic.fsdp_config.optimizer_offload


def test_megatron_entry_point_trains_every_role_with_megatron():
    config = load("PPO_MEGATRON")
    actor = config.actor_rollout_ref.actor
    assert actor.strategy == "megatron" and config.critic.strategy == "megatron"
    assert (actor.megatron.tensor_model_parallel_size, actor.megatron.pipeline_model_parallel_size) == (2, 2)
    assert config.derived.actor_dp_size == 2


def test_megatron_keys_without_the_megatron_entry_are_refused_not_unused():
    args = [a for a in command("PPO_MEGATRON") if not a.startswith("--config")]
    with pytest.raises(ConfigError, match="actor_rollout_ref.actor.strategy=megatron.*or remove them"):
        load_config([*args, *GPU], check_paths=False)


def test_reward_loop_keys_read_as_the_scoring_pool_and_the_reward_model_role():
    _, notes = translate_overrides(command("PPO_REWARD_LOOP"))
    config = load("PPO_REWARD_LOOP")
    assert config.reward_model.enable and config.reward_model.model.path == PATHS["reward_model"]
    assert config.reward_model.scoring_workers == 8
    assert any(n.startswith("reward_model.rollout.gpu_memory_utilization") and "FSDP forward" in n for n in notes)


def test_dapo_reward_manager_overlong_buffer_and_generation_batches():
    config = load("DAPO")
    assert config.reward_model.reward_manager == "naive" and config.reward_model.overlong_buffer.enable
    assert config.reward_model.overlong_buffer.len == 128
    groups = config.algorithm.filter_groups
    assert groups.enable and groups.metric == "score"
    assert groups.max_num_gen_batches == 40  # 10 rounds of gen_batch_size=1024 = 40 rounds of 256 prompts


def test_dapo_reward_kwargs_overlong_buffer_cfg_reads_as_our_overlong_buffer():
    config = load("DAPO", "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
                  "+reward_model.reward_kwargs.overlong_buffer_cfg.len=512",
                  "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5",
                  "+reward_model.reward_kwargs.overlong_buffer_cfg.log=False",
                  "+reward_model.reward_kwargs.max_resp_len=2048")
    assert (config.reward_model.overlong_buffer.len, config.reward_model.overlong_buffer.penalty_factor) == (512, 0.5)
    with pytest.raises(ConfigError, match="max_resp_len=4096 differs from data.max_response_length=2048"):
        load("DAPO", "+reward_model.reward_kwargs.max_resp_len=4096")


@pytest.mark.parametrize("name, reasons", [
    ("PF_PPO", ["PF-PPO"]),
    ("SANDBOX_FUSION", ["sandbox-fusion"]),
    ("GRPO_SGLANG_MEGATRON", ["SGLang"]),
    ("GRPO_SEQ_BALANCE", ["SGLang"]),
    ("DAPO_GMPO", ["Ulysses sequence parallelism is not built", "hybrid sharding"]),
])
def test_verl_examples_of_features_not_built_are_refused_with_every_reason_at_once(name, reasons):
    with pytest.raises(ConfigError) as err:
        load(name)
    for reason in reasons:
        assert reason in str(err.value)


def test_verl_gspo_example_composes_as_written():
    """verl's GSPO script composes as written (its rollout.mode=async is the colocated placement, its
    max_num_batched_tokens vLLM's step budget)."""
    config = load("GSPO")
    assert config.actor_rollout_ref.rollout.mode == "colocate"
    assert config.actor_rollout_ref.rollout.max_num_batched_tokens == 10240
    assert config.actor_rollout_ref.actor.policy_loss.loss_mode == "gspo"
    assert config.actor_rollout_ref.actor.loss_agg_mode == "seq-mean-token-mean"


@pytest.mark.parametrize("override, note", [
    ("trainer.use_legacy_worker_impl=auto", "one worker per role"),
    ("actor_rollout_ref.actor.fsdp_config.fsdp_size=-1", "shards each role over all of its workers"),
    ("actor_rollout_ref.actor.entropy_checkpointing=True", "only saves memory"),
    ("actor_rollout_ref.actor.checkpoint.save_contents=['model','optimizer','extra']", "always hold"),
    ("algorithm.use_pf_ppo=False", "PF-PPO"),
    ("reward_model.sandbox_fusion.url=null", "sandbox-fusion"),
    ("reward_model.use_reward_loop=True", "scoring_workers"),
    ("reward_model.reward_manager=dapo", "reward_model.overlong_buffer"),
    ("reward_model.reward_manager=prime", "scoring_timeout_s"),
    ("actor_rollout_ref.rollout.enable_chunked_prefill=False", "not the samples"),
])
def test_verl_keys_without_a_key_here_are_taken_with_a_note_not_a_wrong_hint(override, note):
    out, notes = translate_overrides([override])
    assert out == [] and len(notes) == 1 and note in notes[0]


@pytest.mark.parametrize("override, message", [
    ("actor_rollout_ref.actor.fsdp_config.fsdp_size=8", "hybrid sharding groups"),
    ("actor_rollout_ref.actor.checkpoint.save_contents=['model','hf_model']", "model_merger"),
    ("--config-name=ppo_sft_trainer", "the PPO trainer's config only"),
    ("actor_rollout_ref.actor.megatron.expert_model_parallel_size=8", "mixture-of-experts"),
])
def test_verl_values_that_cannot_be_honoured_are_refused_with_what_to_use_instead(override, message):
    with pytest.raises(ConfigError, match=message):
        translate_overrides([override])


def test_verl_async_mode_is_the_colocated_placement():
    """verl's rollout.mode=async (agent loops against vLLM on the trainer's own GPUs, asleep during the update) is
    what colocated agent loops do here; it used to ask for servers on a pool of their own (9 devices for 8)."""
    out, notes = translate_overrides(["actor_rollout_ref.rollout.mode=async"])
    assert out == ["actor_rollout_ref.rollout.mode=colocate"] and "read as" in notes[0]
    config = load_config(["actor_rollout_ref.rollout.mode=async"])
    assert config.actor_rollout_ref.rollout.mode == "colocate"
