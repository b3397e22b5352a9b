"""Roles, one per file: the policy (`actor.PPOActor`), the reference policy (`reference.ReferencePolicy`), the
critic (`critic.CriticWorker`), the reward model (`reward_model.RewardModelWorker`); `ppo_update` holds the PPO
epoch loop the actor and critic share."""

from verl_like.workers.actor import PPOActor
from verl_like.workers.critic import CriticWorker
from verl_like.workers.reference import ReferencePolicy, reference_engine_config
from verl_like.workers.reward_model import RewardModelWorker

__all__ = ["CriticWorker", "PPOActor", "ReferencePolicy", "RewardModelWorker", "reference_engine_config"]
