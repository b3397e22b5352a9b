"""actor_rollout_ref.model / critic.model / reward_model.model keys: override_config, trust_remote_code and
critic.model.tokenizer_path are checked against the model on disk and carried into the engine configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl_like.config import ConfigError, compose_config, load_config, to_typed, validate
from verl_like.engine.from_config import actor_engine_config, critic_engine_config, reward_model_engine_config
from verl_like.models.tiny import build_tiny_classifier, build_tiny_model, build_tokenizer

SMOKE = ["+trainer=ci_smoke"]
GAE = ["algorithm.adv_estimator=gae"]

_REMOTE_CONFIG_CODE = '''
from transformers import Qwen2Config


class RemoteQwen2Config(Qwen2Config):
    model_type = "remote_qwen2"
'''


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("model_keys")
    policy = build_tiny_model(root / "policy")
    other = build_tokenizer()
    other.add_tokens(["<tool>"])
    other.save_pretrained(root / "other_tokenizer")
    same = build_tokenizer()
    same.save_pretrained(root / "same_tokenizer")
    remote = root / "remote"
    remote.mkdir()
    (remote / "configuration_remote.py").write_text(_REMOTE_CONFIG_CODE)
    config = json.loads((policy / "config.json").read_text())
    config.update(model_type="remote_qwen2", auto_map={"AutoConfig": "configuration_remote.RemoteQwen2Config"})
    (remote / "config.json").write_text(json.dumps(config))
    return {
        "policy": str(policy), "other": str(root / "other_tokenizer"), "same": str(root / "same_tokenizer"),
        "remote": str(remote), "rm": str(build_tiny_classifier(root / "rm")),
    }


BAD = [
    (["+actor_rollout_ref.model.override_config.foo=1"],
     "actor_rollout_ref.model.override_config.foo: Qwen2Config has no field 'foo'"),
    (["actor_rollout_ref.model.path={policy}", "+actor_rollout_ref.model.override_config.rope_theta=500000.0"],
     "set actor_rollout_ref.model.override_config.rope_parameters.rope_theta instead"),
    (["actor_rollout_ref.model.path={policy}", "+actor_rollout_ref.model.override_config.attention_dropout=0.1"],
     "actor_rollout_ref.model.override_config.attention_dropout=0.1: the engine trains with dropout off"),
    (GAE + ["+critic.model.override_config.bar=1"],
     "critic.model.override_config.bar: Qwen2Config has no field 'bar'"),
    (GAE + ["critic.model.path={policy}", "actor_rollout_ref.model.path={policy}",
            "+critic.model.override_config.max_position_embedding=8"],
     "critic.model.override_config.max_position_embedding: Qwen2Config has no field 'max_position_embedding'; "
     "did you mean max_position_embeddings"),
    (["actor_rollout_ref.model.path={remote}", "+actor_rollout_ref.model.override_config.use_cache=false"],
     "actor_rollout_ref.model.path='{remote}' ships its own model code; set actor_rollout_ref.model.trust_remote_code"),
    (GAE + ["actor_rollout_ref.model.path={policy}", "critic.model.tokenizer_path={other}"],
     "critic.model.tokenizer_path='{other}' has a tokenizer other than the policy's: vocabularies differ"),
    (GAE + ["actor_rollout_ref.model.path={policy}", "critic.model.path={other}"],
     "critic.model.path='{other}' has a tokenizer other than the policy's"),
    (GAE + ["actor_rollout_ref.model.path={policy}", "critic.model.tokenizer_path=tiny"],
     "critic.model.tokenizer_path='tiny' is the builtin tiny tokenizer but actor_rollout_ref.model uses"),
    (GAE + ["critic.model.tokenizer_path=/no/such/dir"],
     "critic.model.tokenizer_path='/no/such/dir': no such directory"),
    # The context check reads override_config.max_position_embeddings, as the engine does.
    (["+actor_rollout_ref.model.override_config.max_position_embeddings=100", "data.max_prompt_length=64",
      "data.max_response_length=64"], "exceeds the model's max_position_embeddings=100"),
    (["actor_rollout_ref.model.use_fused_kernels=true"],
     "actor_rollout_ref.model.use_fused_kernels=true runs Triton kernels on CUDA, but trainer.device=cpu"),
    (["actor_rollout_ref.model.use_fused_kernels=true", "actor_rollout_ref.actor.strategy=megatron"],
     "actor_rollout_ref.actor.use_fused_kernels=true swaps layers of the HF model the fsdp2 engine trains"),
]


@pytest.mark.parametrize(("overrides", "message"), BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_model_key_is_refused_naming_it(overrides, message, dirs, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ConfigError) as excinfo:
        load_config(SMOKE + [o.format(**dirs) for o in overrides])
    assert message.format(**dirs) in str(excinfo.value)


def test_unknown_override_is_not_checked_without_path_checks(dirs):
    overrides = SMOKE + [
        f"actor_rollout_ref.model.path={dirs['policy']}", "+actor_rollout_ref.model.override_config.foo=1"
    ]
    validate(to_typed(compose_config(overrides)), check_paths=False)  # the model may live on another machine


def test_valid_overrides_reach_the_actor_reference_and_critic_engine_configs(dirs):
    from verl_like.engine.from_config import reference_engine_config

    config = load_config(SMOKE + GAE + [
        f"actor_rollout_ref.model.path={dirs['policy']}",
        "+actor_rollout_ref.model.override_config.rope_parameters.rope_theta=20000.0",
        "+actor_rollout_ref.model.override_config.attention_dropout=0.0",
        "actor_rollout_ref.model.trust_remote_code=true",
        "+critic.model.override_config.max_position_embeddings=4096",
        f"critic.model.tokenizer_path={dirs['same']}",
    ])
    model = config.actor_rollout_ref.model
    actor = actor_engine_config(
        config.actor_rollout_ref.actor, dirs["policy"], override_config=model.override_config,
        trust_remote_code=model.trust_remote_code,
    )
    assert actor.overrides == {"attention_dropout": 0.0, "rope_parameters": {"rope_theta": 20000.0}}
    assert actor.trust_remote_code
    ref = reference_engine_config(actor, config.actor_rollout_ref.ref)
    assert ref.override_config == actor.override_config and ref.trust_remote_code
    critic = critic_engine_config(config.critic, dirs["policy"])
    assert critic.overrides == {"max_position_embeddings": 4096} and not critic.trust_remote_code
    assert critic.model_kind == "value"


def test_critic_trust_remote_code_reaches_its_engine_config():
    config = load_config(SMOKE + GAE + ["critic.model.trust_remote_code=true"])
    assert critic_engine_config(config.critic, "/m").trust_remote_code


def test_trust_remote_code_lets_a_remote_code_model_validate(dirs):
    config = load_config(SMOKE + [
        f"actor_rollout_ref.model.path={dirs['remote']}", "actor_rollout_ref.model.trust_remote_code=true",
        "+actor_rollout_ref.model.override_config.use_cache=false",
    ])
    assert config.actor_rollout_ref.model.override_config == {"use_cache": False}


def test_reward_model_trust_remote_code_is_accepted_and_reaches_the_engine_config(dirs):
    config = load_config(SMOKE + [
        "reward_model.enable=true", f"reward_model.model.path={dirs['rm']}",
        "reward_model.model.trust_remote_code=true",
    ])
    assert reward_model_engine_config(config.reward_model).trust_remote_code
    plain = load_config(SMOKE + ["reward_model.enable=true", f"reward_model.model.path={dirs['rm']}"])
    assert not reward_model_engine_config(plain.reward_model).trust_remote_code


def test_a_critic_tokenizer_equal_to_the_policys_validates(dirs):
    config = load_config(SMOKE + GAE + [
        f"actor_rollout_ref.model.path={dirs['policy']}", f"critic.model.tokenizer_path={dirs['same']}",
        f"critic.model.path={dirs['policy']}",
    ])
    assert config.critic.model.tokenizer_path == dirs["same"]


def test_use_fused_kernels_reaches_the_actor_engine_config():
    config = to_typed(compose_config(SMOKE + ["actor_rollout_ref.model.use_fused_kernels=true"]))
    assert config.actor_rollout_ref.actor.use_fused_kernels
    assert actor_engine_config(config.actor_rollout_ref.actor, "tiny").fused_kernels
    assert not actor_engine_config(to_typed(compose_config(SMOKE)).actor_rollout_ref.actor, "tiny").fused_kernels
