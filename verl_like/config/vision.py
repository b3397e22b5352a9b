"""The settings an image-prompt run refuses, checked once images are known to be used (before any worker starts).

Called from validation when the training data is a synthetic image task, and from the trainer's setup once the
datasets are read and some row holds images (data/vision.py). Each refusal names the key and what to set.
"""

from __future__ import annotations

from typing import Any

from verl_like.config.derived import uses_critic
from verl_like.config.errors import ConfigError
from verl_like.config.rollout_backends import ROLLOUT_BACKENDS, rollout_backend

_A = "actor_rollout_ref"


def check_vision_options(config: Any) -> None:
    """Raises ConfigError for the first setting image prompts do not support yet."""
    rollout, actor = config.actor_rollout_ref.rollout, config.actor_rollout_ref.actor
    refusals = (
        (config.placement.uses_servers and config.async_training.partial_rollout,
         "async_training.partial_rollout=true with rollout.mode=server: no test checks yet that an image request "
         "frozen across a weight update gets its vision embeddings recomputed by the new weights; set it to false"),
        (config.placement.uses_servers and config.actor_rollout_ref.model.lora_rank > 0
         and not config.actor_rollout_ref.model.lora.merge,
         f"{_A}.model.lora_rank={config.actor_rollout_ref.model.lora_rank} with rollout.mode=server: adapter-only "
         "sync into servers is not tested with image prompts yet; set actor_rollout_ref.model.lora.merge=true or "
         "rollout.mode=colocate"),
        (not rollout_backend(rollout.name).images, f"{_A}.rollout.name={rollout.name!r}: its backend does not pass "
         "images to the model; set it to one that does: "
         + ", ".join(name for name, entry in sorted(ROLLOUT_BACKENDS.items()) if entry.images)),
        (config.actor_rollout_ref.model.use_remove_padding or actor.use_remove_padding,
         f"{_A}.model.use_remove_padding=true packs rows, which image prompts do not support yet (the models match "
         "image features to padded rows, and Qwen2-VL's packed M-RoPE positions would need their own text row, "
         "not built); set it to false"),
        (rollout.weight_sync_mode != "full", f"{_A}.rollout.weight_sync_mode={rollout.weight_sync_mode!r}: the sliced "
         "plan knows text decoders' layouts only; set it to full (vLLM's own loader maps the vision tower)"),
        (rollout.sync_check, f"{_A}.rollout.sync_check=true: its probe is random text ids, which may hold the "
         "image placeholder (a forward without pixels then fails); set it to false: every step logs "
         "rollout/image_logprob_diff_max, the trainer-vs-vLLM gap on the image prompts themselves"),
        (actor.strategy != "fsdp2", f"{_A}.actor.strategy={actor.strategy!r}: the megatron engine trains text "
         "decoders only; set it to fsdp2"),
        (uses_critic(config), "a critic (critic.enable, or a value-based adv_estimator) is a text value model and "
         "would not see the "
         "images; use a critic-free estimator (grpo, rloo, ...) and critic.enable=false"),
        (config.reward_model.enable, "reward_model.enable=true: the reward model is a text classifier and would not "
         "see the images; score image prompts with rule scorers or custom_reward_function"),
    )
    for refused, message in refusals:
        if refused:
            raise ConfigError(f"image prompts: {message}")


def synthetic_image_task(path: str) -> bool:
    """True for a `synthetic:<task>` data source whose task draws images."""
    from verl_like.data.synthetic import get_task, parse_synthetic_spec  # function level: config stays a leaf

    return get_task(parse_synthetic_spec(path)[0]).render is not None
