"""The driver side: the PPO trainer loop, its metrics and checkpoints.

`from verl_like.trainer import PPOTrainer` gives the trainer with verl's programmatic arguments
(`verl_like/trainer/api.py`); it is imported on first use, so importing a submodule stays light.
"""

from typing import Any

__all__ = ["PPOTrainer"]


def __getattr__(name: str) -> Any:
    if name == "PPOTrainer":
        from verl_like.trainer.api import PPOTrainer

        return PPOTrainer
    raise AttributeError(f"module 'verl_like.trainer' has no attribute {name!r}")
