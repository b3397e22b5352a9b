"""The keys the reward-model role, batch balancing, MFU and checkpoint rotation added: bad values are refused
with the key named; a reward model is validated against the policy's tokenizer before anything starts."""

from __future__ import annotations

import pytest

from verl_like.config import ConfigError, load_config
from verl_like.models.tiny import build_tiny_classifier, build_tokenizer

SMOKE = ["+trainer=ci_smoke"]

BAD = [
    (["reward_model.combine=mean"], "reward_model.combine='mean' must be one of ('add', 'replace')"),
    (["reward_model.forward_max_token_len_per_gpu=0"], "reward_model.forward_max_token_len_per_gpu=0 must be >= 1"),
    (["reward_model.model.fsdp_config.optimizer_offload=true"],
     "reward_model.model.fsdp_config.optimizer_offload=true but the reward model is inference-only"),
    (["reward_model.model.fsdp_config.model_dtype=fp16"], "reward_model.model.fsdp_config.model_dtype='fp16'"),
    (["actor_rollout_ref.ref.fsdp_config.optimizer_offload=true"],
     "actor_rollout_ref.ref.fsdp_config.optimizer_offload=true but the reference policy has no optimizer"),
    (["reward_model.error_policy=ignore"],
     "reward_model.error_policy='ignore' must be one of ('fail', 'zero', 'skip')"),
    (["reward_model.max_error_fraction=2"], "reward_model.max_error_fraction=2.0 must lie in [0, 1]"),
    (["trainer.ray_init.dashboard_port=0"], "trainer.ray_init.dashboard_port=0 must be a port in 1..65535"),
    (["trainer.peak_tflops_per_device=0"], "trainer.peak_tflops_per_device=0.0 must be > 0"),
    (["trainer.max_critic_ckpt_to_keep=0"], "trainer.max_critic_ckpt_to_keep=0 must be >= 1, or null"),
    (["reward_model.enable=true", "reward_model.model.path={rm}", "reward_model.combine=replace",
      "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc"],
     "algorithm.filter_groups.metric='acc' compares the rule scorer's score, but reward_model.combine='replace'"),
    (["reward_model.enable=true", "reward_model.model.path={other}"],
     "has a tokenizer other than the policy's: vocabularies differ"),
]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("rm_config")
    other = build_tokenizer()
    other.add_tokens(["<tool>"])
    other.save_pretrained(root / "other")
    return {"rm": str(build_tiny_classifier(root / "rm")), "other": str(root / "other")}


@pytest.mark.parametrize(("overrides", "message"), BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_value_is_refused_with_the_key(overrides, message, model_dirs, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    overrides = [o.format(**model_dirs) for o in overrides]
    with pytest.raises(ConfigError) as excinfo:
        load_config(SMOKE + overrides)
    assert message in str(excinfo.value)


def test_a_reward_model_with_the_policy_tokenizer_validates(model_dirs):
    config = load_config(SMOKE + ["reward_model.enable=true", f"reward_model.model.path={model_dirs['rm']}",
                                  "reward_model.combine=replace", "algorithm.filter_groups.enable=true",
                                  "algorithm.filter_groups.metric=score", "trainer.peak_tflops_per_device=2.5"])
    assert config.derived.use_reward_model and config.reward_model.combine == "replace"
    assert config.trainer.peak_tflops_per_device == 2.5
