"""The phases of one trainer step, and what a phase gets to see.

A step is: the rollout phase (generate, score, dump; PPOTrainer._collect_rollouts, where agent loops plug in
through the rollout handle) and then one update phase, chosen once from the config:

- PPO / GRPO / RLOO / REINFORCE++ / ReMax / DAPO (and distillation, its teacher term a hook of the same update):
  old and reference log-probs, values, advantages, the critic's and the actor's updates, the weight sync
  (PPOTrainer._ppo_update);
- online DPO: judge pairs, reference log-probs of the pair rows, the DPO update, the weight sync
  (trainer/online_dpo_step.py).

An update phase is `phase(ctx, batch, timings, metrics) -> batch`: it reads the run through `StepContext` (the
typed config, the components, the step number) and never the trainer object, so phases import nothing of the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from verl_like.protocol import DataProto

if TYPE_CHECKING:
    from verl_like.config.ppo import PPOConfig
    from verl_like.trainer.setup import TrainerComponents


@dataclass(frozen=True)
class StepContext:
    """What an update phase may read: the run's typed config, its components (roles, rollout handle, loaders),
    and `global_step`, the number of steps finished before this one."""

    config: PPOConfig
    components: TrainerComponents
    global_step: int


UpdatePhase = Callable[[StepContext, DataProto, dict[str, float], dict[str, float]], DataProto]
"""An update phase: (context, the rollout phase's scored batch, timings, metrics) -> the batch it trained on;
it adds its metrics and timings to the dicts it is given."""


def select_update_phase(config: Any, ppo_update: UpdatePhase) -> tuple[str, UpdatePhase]:
    """The update phase of `config`: online DPO with online_dpo.enable, else `ppo_update`. Its name too."""
    if config.online_dpo.enable:
        from verl_like.trainer.online_dpo_step import online_dpo_update

        return "online_dpo", online_dpo_update
    return "ppo", ppo_update
