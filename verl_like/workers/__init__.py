"""Roles, one per file: the policy (`actor.PPOActor`), the reference policy (`reference.ReferencePolicy`), the
critic (`critic.CriticWorker`), the reward model (`reward_model.RewardModelWorker`); `ppo_update` holds the PPO
epoch loop the actor and critic share; `actor_rollout.ActorRolloutWorker` (actor + rollout + reference, the class to
subclass for a custom rollout) is imported on first use, as `from verl_like.workers import ActorRolloutWorker`."""

from typing import Any

from verl_like.workers.actor import PPOActor
from verl_like.workers.critic import CriticWorker
from verl_like.engine.from_config import reference_engine_config
from verl_like.workers.reference import ReferencePolicy
from verl_like.workers.reward_model import RewardModelWorker

__all__ = ["ActorRolloutWorker", "CriticWorker", "PPOActor", "ReferencePolicy", "RewardModelWorker", "reference_engine_config"]


def __getattr__(name: str) -> Any:
    # Lazy: actor_rollout imports this package's actor module, so an eager import here would be circular.
    if name == "ActorRolloutWorker":
        from verl_like.workers.actor_rollout import ActorRolloutWorker

        return ActorRolloutWorker
    raise AttributeError(f"module 'verl_like.workers' has no attribute {name!r}")
