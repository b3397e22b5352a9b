"""Image prompts: the vlm_tiny preset validates, and what image prompts do not support is refused naming the key."""

import pytest

from verl_like.config import ConfigError, load_config

REFUSED = [
    ("actor_rollout_ref.rollout.mode=server async_training.enable=true async_training.staleness=1 "
     "async_training.partial_rollout=true",
     "async_training.partial_rollout=true with rollout.mode=server"),
    ("actor_rollout_ref.model.use_remove_padding=true", "actor_rollout_ref.model.use_remove_padding=true"),
    ("actor_rollout_ref.rollout.weight_sync_mode=sliced", "actor_rollout_ref.rollout.weight_sync_mode='sliced'"),
    ("actor_rollout_ref.rollout.sync_check=true", "actor_rollout_ref.rollout.sync_check=true"),
    ("algorithm.adv_estimator=gae", "a critic"),
]


def test_the_vlm_tiny_preset_validates():
    config = load_config(["+trainer=vlm_tiny"])
    assert config.data.train_files == ("synthetic:count",) and config.data.image_key == "images"
    assert config.actor_rollout_ref.actor.freeze_vision_tower is False


@pytest.mark.parametrize("override, named", REFUSED, ids=[o.split("=")[0].rsplit(".", 1)[-1] for o, _ in REFUSED])
def test_image_prompts_refuse_what_they_do_not_support_naming_the_key(override, named):
    with pytest.raises(ConfigError, match="image prompts") as err:
        load_config(["+trainer=vlm_tiny", *override.split()])
    assert named in str(err.value)


@pytest.mark.parametrize("overrides", [["actor_rollout_ref.rollout.mode=server"],
                                       ["actor_rollout_ref.rollout.multi_turn.enable=true",
                                        "data.return_raw_chat=true"],
                                       ["actor_rollout_ref.rollout.mode=server",
                                        "actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent"]],
                         ids=["server", "multi_turn", "server_agent_loop"])
def test_image_prompts_take_servers_and_agent_loops(overrides):
    load_config(["+trainer=vlm_tiny", *overrides])


def test_freeze_vision_tower_is_refused_with_megatron():
    with pytest.raises(Exception, match="freeze_vision_tower=true"):
        load_config(["actor_rollout_ref.actor.freeze_vision_tower=true", "actor_rollout_ref.actor.strategy=megatron"])


def test_adapter_only_lora_in_server_mode_with_images_is_refused_until_tested():
    with pytest.raises(ConfigError, match="not tested with image prompts yet; set actor_rollout_ref.model.lora.merge"):
        load_config(["+trainer=vlm_tiny", "actor_rollout_ref.rollout.mode=server",
                     "actor_rollout_ref.model.lora_rank=8"], check_paths=False)
