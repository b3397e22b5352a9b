"""Runs a validated config: environment, Ray, the trainer, and a clean shutdown on any exit."""

from __future__ import annotations

import logging
from typing import Any

from verl_like.config.ppo import PPOConfig
from verl_like.single_controller import init_ray
from verl_like.single_controller.cluster import job_scratch_path
from verl_like.trainer.ppo_trainer import PPOTrainer
from verl_like.trainer.preflight import run_preflight
from verl_like.utils.device import resolve_device
from verl_like.utils.env import apply_default_env

logger = logging.getLogger(__name__)


def launch(config: PPOConfig, *, preflight: bool = True, **trainer_kwargs: Any) -> dict[str, float]:
    """Checks the machine, starts (or joins) Ray, trains, and always releases the workers; returns the last step's
    metrics.

    preflight: run `run_preflight` (devices, loggers, data, run directory, ports) before Ray; main_ppo has run it
    already and passes False.
    """
    trainer_cfg = config.trainer
    if preflight:
        run_preflight(config, reward_fn=trainer_kwargs.get("reward_fn"))
    env = apply_default_env(resolve_device(trainer_cfg.device))
    ray_init = trainer_cfg.ray_init
    init_ray(
        address=trainer_cfg.ray_address,
        num_cpus=ray_init.num_cpus,
        num_gpus=ray_init.num_gpus,
        object_store_memory_mb=ray_init.object_store_memory_mb,
        include_dashboard=ray_init.include_dashboard,
        dashboard_host=ray_init.dashboard_host,
        dashboard_port=ray_init.dashboard_port,
        env_vars=env,
    )
    scratch = job_scratch_path(trainer_cfg.default_local_dir)
    if scratch is not None:
        logger.warning(
            "trainer.default_local_dir=%s is relative: in this Ray job it is %s, inside the job's copy of the "
            "uploaded working dir (a new copy for every changed upload, removed when Ray cleans its cache), so a "
            "later job will not resume from it. Set an absolute path on storage every node mounts at the same "
            "place (every rank writes its own checkpoint shard).",
            trainer_cfg.default_local_dir,
            scratch,
        )
    trainer = PPOTrainer(config, **trainer_kwargs)
    try:
        trainer.init_workers()
        return trainer.fit()
    finally:
        trainer.shutdown()
