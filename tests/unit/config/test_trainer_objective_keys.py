"""The online_dpo and distillation nodes: presets, derived roles, and errors that name the key and the fix."""

from __future__ import annotations

import pytest

from verl_like.config import ConfigError, load_config

BAD = [
    (["online_dpo.beta=0"], "online_dpo.beta=0.0 must be > 0"),
    (["online_dpo.loss_type=hinge"], "online_dpo.loss_type='hinge' must be one of"),
    (["online_dpo.label_smoothing=0.5"], "online_dpo.label_smoothing=0.5 must lie in [0, 0.5)"),
    (["online_dpo.loss_type=ipo", "online_dpo.label_smoothing=0.1"], "applies to loss_type='sigmoid' only"),
    (["online_dpo.tie_breaking=first"], "online_dpo.tie_breaking='first' must be one of"),
    (["+trainer=online_dpo", "actor_rollout_ref.rollout.n=1"], "online_dpo.enable=true needs actor_rollout_ref.rollout.n >= 2"),
    (["+trainer=online_dpo", "actor_rollout_ref.actor.shuffle=true"],
     "does not support actor_rollout_ref.actor.shuffle=true"),
    (["+trainer=online_dpo", "actor_rollout_ref.actor.use_dynamic_bsz=true"],
     "does not support actor_rollout_ref.actor.use_dynamic_bsz=true"),
    (["+trainer=online_dpo", "actor_rollout_ref.actor.ppo_epochs=2"], "set actor_rollout_ref.actor.ppo_epochs=1"),
    (["+trainer=online_dpo", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"],
     "even actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"),
    (["distillation.loss=kl"], "distillation.loss='kl' must be one of"),
    (["distillation.top_k=0"], "distillation.top_k=0 must be >= 1"),
    (["distillation.coef=0"], "distillation.coef=0.0 must be > 0"),
    (["distillation.enable=true"], "distillation.enable=true needs distillation.teacher.path"),
    (["distillation.teacher.dtype=int8"], "distillation.teacher.dtype='int8' must be one of"),
    (["+trainer=online_dpo", "distillation.enable=true", "distillation.teacher.path=tiny_teacher"],
     "distillation.enable and online_dpo.enable are both true"),
    (["+online_dpo.gamma=1"], "unknown config key 'online_dpo.gamma'"),
]


@pytest.mark.parametrize("overrides,message", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_objective_settings_name_the_key(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(overrides, check_paths=False)
    assert message in str(err.value)


def test_online_dpo_preset_runs_the_reference_and_no_critic() -> None:
    config = load_config(["+trainer=online_dpo"], check_paths=False)
    assert config.online_dpo.enable and config.online_dpo.beta == 0.5
    assert config.derived.use_reference_policy and not config.derived.use_critic
    assert not load_config([], check_paths=False).derived.use_reference_policy


def test_distillation_teacher_path_is_checked_with_paths(tmp_path) -> None:
    overrides = ["distillation.enable=true", f"distillation.teacher.path={tmp_path}"]
    with pytest.raises(ConfigError, match="distillation.teacher.path=.* has no config.json"):
        load_config(overrides)
    load_config(overrides, check_paths=False)
    config = load_config(["+trainer=distill"])
    assert config.distillation.teacher.path == "tiny_teacher" and not config.derived.use_reference_policy
