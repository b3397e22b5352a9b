"""`actor_rollout_ref.model.use_fused_kernels: null` (auto), decided once on the driver when the config is loaded.

Auto means on exactly when the fused layers can run and serve the model: trainer.device=cuda (Triton kernels),
actor.strategy=fsdp2 (the megatron engine builds its own layers) and a model family whose RMSNorm / MLP classes
engine/fused_layers.py swaps (RMSNORM_CLASSES, MLP_CLASSES; a unit test keeps the two lists in step). The
decision and its reason are logged; true / false set by the user are kept as they are (validation and the engine
refuse a true that cannot run, as before).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from verl_like.config.model import hf_model_type

if TYPE_CHECKING:
    from verl_like.config.ppo import PPOConfig

logger = logging.getLogger(__name__)

# HF model_type of the families whose RMSNorm and SiLU MLP engine/fused_layers.py fuses.
FUSED_MODEL_TYPES = ("qwen2", "qwen3", "llama", "mistral")


@dataclass(frozen=True)
class FusedKernelsChoice:
    """What auto decided: `enabled`, and `reason` in words (logged at start-up)."""

    enabled: bool
    reason: str


def choose_fused_kernels(device: str, strategy: str, model_type: str | None) -> FusedKernelsChoice:
    """Auto's decision for trainer.device `device`, the actor's canonical `strategy` and the model's HF
    `model_type` (None: unknown, e.g. no readable config.json)."""
    if device != "cuda":
        return FusedKernelsChoice(False, f"trainer.device={device} (the fused kernels run on CUDA only)")
    if strategy != "fsdp2":
        return FusedKernelsChoice(False, f"actor.strategy={strategy} (its engine builds its own layers)")
    if model_type not in FUSED_MODEL_TYPES:
        family = "unknown (no readable config.json)" if model_type is None else repr(model_type)
        return FusedKernelsChoice(False, f"model_type {family} is not one of {', '.join(FUSED_MODEL_TYPES)}")
    return FusedKernelsChoice(True, f"trainer.device=cuda, strategy=fsdp2, model_type {model_type!r}")


def resolve_fused_kernels(config: PPOConfig) -> PPOConfig:
    """`config` with a null use_fused_kernels (model's and actor's keys) replaced by auto's decision, logged;
    the same object when neither key is null (an explicit value wins, and a second call changes nothing)."""
    arr = config.actor_rollout_ref
    model, actor = arr.model, arr.actor
    if model.use_fused_kernels is not None and actor.use_fused_kernels is not None:
        return config
    choice = choose_fused_kernels(config.trainer.device, actor.strategy, hf_model_type(model, config.data))
    logger.info("actor_rollout_ref.model.use_fused_kernels=auto: %s (%s)", str(choice.enabled).lower(), choice.reason)
    # The actor's key follows the model's by interpolation; a value the user set on either one stays.
    model_value = choice.enabled if model.use_fused_kernels is None else model.use_fused_kernels
    actor_value = model_value if actor.use_fused_kernels is None else actor.use_fused_kernels
    arr = dataclasses.replace(
        arr,
        model=dataclasses.replace(model, use_fused_kernels=model_value),
        actor=dataclasses.replace(actor, use_fused_kernels=actor_value),
    )
    return dataclasses.replace(config, actor_rollout_ref=arr)
