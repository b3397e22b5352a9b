"""Roles, one per file: the policy (`actor.PPOActor`), the reference policy (`reference.ReferencePolicy`), the
critic (`critic.CriticWorker`); `ppo_update` holds the PPO epoch loop the actor and critic share."""

from verl_like.workers.actor import PPOActor
from verl_like.workers.critic import CriticWorker
from verl_like.workers.reference import ReferencePolicy, reference_engine_config

__all__ = ["CriticWorker", "PPOActor", "ReferencePolicy", "reference_engine_config"]
