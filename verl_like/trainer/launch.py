"""Runs a validated config: environment, Ray, the trainer, and a clean shutdown on any exit."""

from __future__ import annotations

import logging
import os
from typing import Any

from verl_like.config.ppo import PPOConfig
from verl_like.single_controller import init_ray
from verl_like.single_controller.cluster import job_scratch_path
from verl_like.trainer.ppo_trainer import PPOTrainer
from verl_like.trainer.preflight import run_preflight
from verl_like.trainer.restarts import fit_with_restarts
from verl_like.trainer.run_summary import format_summary
from verl_like.utils.device import resolve_device
from verl_like.utils.env import apply_default_env
from verl_like.utils.quiet_logs import install_noise_filters, log_level_env

logger = logging.getLogger(__name__)


def start_ray(config: PPOConfig, *, preflight: bool = True, reward_fn: Any = None) -> None:
    """Checks the machine (`run_preflight`: devices, loggers, data, run directory, ports; skipped with
    preflight=False when the caller ran it), sets the process environment for trainer.device and starts or joins
    Ray (nothing if it runs already)."""
    trainer_cfg = config.trainer
    device = resolve_device(trainer_cfg.device)
    if preflight:
        run_preflight(config, reward_fn=reward_fn)
    env = apply_default_env(device)
    env.update(log_level_env(trainer_cfg.log_level))  # the configured level wins over an inherited one
    os.environ.update(env)
    install_noise_filters(trainer_cfg.log_level)  # Ray's start-up notices on this process's console
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


def launch(config: PPOConfig, *, preflight: bool = True, **trainer_kwargs: Any) -> dict[str, float]:
    """Checks the machine, starts (or joins) Ray, trains, and always releases the workers; returns the last step's
    metrics. preflight: False when the caller ran `run_preflight` already (main_ppo)."""
    trainer_cfg = config.trainer
    start_ray(config, preflight=preflight, reward_fn=trainer_kwargs.get("reward_fn"))
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
        metrics = fit_with_restarts(trainer.fit, trainer.restart_workers, lambda: trainer.global_step,
                                    trainer_cfg.max_restarts)
    finally:
        trainer.shutdown()
    # After the workers are gone (and Ray's deferred messages with them): how the run went, and where it is.
    summary = format_summary(trainer.record, trainer.run_dir, trainer_cfg.logger, trainer_cfg.save_freq)
    logger.info("%s", summary)
    return metrics
