"""Runs a validated config: environment, Ray, the trainer, and a clean shutdown on any exit."""

from __future__ import annotations

import logging
from typing import Any

from verl_like.config.ppo import PPOConfig
from verl_like.single_controller import init_ray
from verl_like.trainer.ppo_trainer import PPOTrainer
from verl_like.utils.device import resolve_device
from verl_like.utils.env import apply_default_env

logger = logging.getLogger(__name__)


def launch(config: PPOConfig, **trainer_kwargs: Any) -> dict[str, float]:
    """Starts (or joins) Ray, trains, and always releases the workers; returns the last step's metrics."""
    trainer_cfg = config.trainer
    env = apply_default_env(resolve_device(trainer_cfg.device))
    ray_init = trainer_cfg.ray_init
    init_ray(
        address=trainer_cfg.ray_address,
        num_cpus=ray_init.num_cpus,
        num_gpus=ray_init.num_gpus,
        object_store_memory_mb=ray_init.object_store_memory_mb,
        include_dashboard=ray_init.include_dashboard,
        env_vars=env,
    )
    trainer = PPOTrainer(config, **trainer_kwargs)
    try:
        trainer.init_workers()
        return trainer.fit()
    finally:
        trainer.shutdown()
