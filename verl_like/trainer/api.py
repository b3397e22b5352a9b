"""`verl_like.trainer.PPOTrainer`: the loop trainer with verl's programmatic arguments, runnable without a config.

    from verl_like.workers import ActorRolloutWorker
    from verl_like.trainer import PPOTrainer

    trainer = PPOTrainer(actor_rollout_worker=VLLMActorWorker, actor_rollout_kwargs={"model_name": path},
                         critic_model=critic_path, reward_model=rm_path_or_callable)
    trainer.fit()   # starts Ray (or joins it), builds the workers, trains, releases them

What it adds to `verl_like.trainer.ppo_trainer.PPOTrainer`:
- `config` may be None (the embedded default task, configs/ppo_trainer.yaml), a list of `key=value` overrides
  (`["+trainer=ci_smoke", "data.train_batch_size=8"]`), or a validated PPOConfig;
- `critic_model`: a model path; the run becomes PPO with GAE and that critic (`algorithm.adv_estimator=gae`,
  `critic.model.path=...`);
- `reward_model`: a path to a sequence-classification model (`reward_model.enable=true`, its path), or a callable
  `(data_source, solution_str, ground_truth, extra_info) -> float` used as the reward function;
- a model named in `actor_rollout_kwargs` (`model_name`, `model_path` or `model`) becomes the policy the actor
  trains (`actor_rollout_ref.model.path`), so the user's engine and the actor hold the same model;
- the worker class goes through `verl_like.workers.custom_worker.adapt_worker_class` (the tutorial's constructor
  shape, automatic weight updates into a `vllm.LLM` the worker holds);
- `fit()` sets up Ray and the workers itself when `init_workers()` was not called, and releases them after.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from verl_like.config.ppo import PPOConfig
from verl_like.trainer.ppo_trainer import PPOTrainer as LoopTrainer

logger = logging.getLogger(__name__)


def programmatic_overrides(
    critic_model: str | None, reward_model: str | Callable[..., Any] | None, policy_model: str | None
) -> list[str]:
    """The `key=value` overrides that PPOTrainer's critic_model / reward_model / worker model name stand for."""
    overrides = []
    if policy_model is not None:
        overrides.append(f"actor_rollout_ref.model.path={policy_model}")
    if critic_model is not None:
        overrides += ["algorithm.adv_estimator=gae", f"critic.model.path={critic_model}"]
    if isinstance(reward_model, str):
        overrides += ["reward_model.enable=true", f"reward_model.model.path={reward_model}"]
    elif reward_model is not None and not callable(reward_model):
        raise TypeError(
            f"PPOTrainer(reward_model={reward_model!r}): pass a path to a sequence-classification model or a callable "
            "(data_source, solution_str, ground_truth, extra_info) -> float"
        )
    return overrides


def resolve_trainer_config(config: PPOConfig | Sequence[str] | None, overrides: list[str]) -> PPOConfig:
    """The validated config: `config`'s overrides (None: the embedded default) plus `overrides`."""
    from verl_like.config.loader import load_config

    if isinstance(config, PPOConfig):
        if overrides:
            raise TypeError(
                f"PPOTrainer got a built PPOConfig and arguments that change it ({overrides}); pass config as a list "
                "of key=value overrides instead (e.g. config=['+trainer=ci_smoke']) so they can be combined"
            )
        return config
    if isinstance(config, str) or (config is not None and not isinstance(config, Sequence)):
        raise TypeError(f"PPOTrainer(config=...) takes None, a list of key=value overrides or a PPOConfig, not {config!r}")
    # No config: the embedded default task (named as its preset, so that a model named by the worker's kwargs
    # does not switch the other keys to verl's defaults, as it would on a command line).
    base = ["+trainer=default_task"] if config is None else list(config)
    return load_config([*base, *overrides])


class PPOTrainer(LoopTrainer):
    """The trainer loop with verl's programmatic arguments (see the module doc for what each one does)."""

    def __init__(
        self,
        config: PPOConfig | Sequence[str] | None = None,
        actor_rollout_worker: type | None = None,
        actor_rollout_kwargs: dict[str, Any] | None = None,
        critic_worker: type | None = None,
        reward_fn: Callable[..., Any] | None = None,
        reward_model_worker: type | None = None,
        critic_model: str | None = None,
        reward_model: str | Callable[..., Any] | None = None,
    ) -> None:
        from verl_like.workers.custom_worker import adapt_worker_class, model_named_by

        kwargs = dict(actor_rollout_kwargs or {})
        worker = adapt_worker_class(actor_rollout_worker) if actor_rollout_worker is not None else None
        policy = model_named_by(kwargs) if worker is not None else None
        config = resolve_trainer_config(config, programmatic_overrides(critic_model, reward_model, policy))
        if callable(reward_model) and not isinstance(reward_model, str):
            if reward_fn is not None:
                raise TypeError("PPOTrainer got both reward_fn and a callable reward_model; pass one of them")
            reward_fn = reward_model
        logger.info(
            "PPOTrainer: worker %s, estimator %s, critic %s, reward model %s",
            actor_rollout_worker.__qualname__ if actor_rollout_worker else "ActorRolloutWorker",
            config.algorithm.adv_estimator, config.critic.model.path or "-",
            config.reward_model.model.path if config.reward_model.enable else "-",
        )
        super().__init__(config, worker, kwargs, critic_worker, reward_fn, reward_model_worker)

    def fit(self) -> dict[str, float]:
        """Trains; when init_workers() was not called, also starts Ray and the workers and releases them after."""
        if self.components is not None:
            return super().fit()
        from verl_like.trainer.launch import start_ray

        from verl_like.trainer.restarts import fit_with_restarts

        start_ray(self.config, reward_fn=self._reward_fn)
        try:
            self.init_workers()
            return fit_with_restarts(super().fit, self.restart_workers, lambda: self.global_step,
                                     self.config.trainer.max_restarts)
        finally:
            self.shutdown()
