"""Typed, frozen configs for every node of configs/ppo_trainer.yaml, their loading and validation.

    from verl_like.config import load_config
    config = load_config(["+trainer=ci_smoke", "data.train_batch_size=8"])   # compose, type, validate
    config.derived.ppo_mini_batch_size_per_rank

docs/config.md lists every key, its default and meaning, and every preset.
"""

from verl_like.config.derived import DerivedSizes, derive_sizes
from verl_like.config.errors import ConfigError
from verl_like.config.loader import compose_config, list_presets, load_config, to_typed
from verl_like.config.ppo import PPOConfig
from verl_like.config.validate import validate

__all__ = [
    "ConfigError",
    "DerivedSizes",
    "PPOConfig",
    "compose_config",
    "derive_sizes",
    "list_presets",
    "load_config",
    "to_typed",
    "validate",
]
