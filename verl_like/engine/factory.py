"""build_engine: the one place a role's `strategy` becomes a TrainEngine (FSDP2, or Megatron-core).

Workers call it and never branch on the strategy themselves:

    engine = build_engine(actor_engine_config(actor, path), actor.strategy, actor.megatron)
"""

from __future__ import annotations

from verl_like.config.megatron import MegatronConfig
from verl_like.engine.base import TrainEngine
from verl_like.engine.config import EngineConfig


def build_engine(
    engine_config: EngineConfig, strategy: str = "fsdp2", megatron: MegatronConfig | None = None
) -> TrainEngine:
    """The TrainEngine of `strategy` ("fsdp2" or "megatron"; megatron needs the role's MegatronConfig).

    The Megatron engine is imported only here and only for strategy=megatron, so FSDP runs never need
    megatron-core; a failed import names the package and the config keys to change.
    """
    if strategy == "fsdp2":
        from verl_like.engine.fsdp import FSDPEngine

        return FSDPEngine(engine_config)
    if strategy != "megatron":
        raise ValueError(f"build_engine: strategy={strategy!r} is not one of ('fsdp2', 'megatron')")
    if megatron is None:
        raise ValueError("build_engine: strategy='megatron' needs the role's MegatronConfig (its `megatron` node)")
    try:
        from verl_like.engine.megatron.engine import MegatronEngine
    except ImportError as err:
        raise RuntimeError(
            f"strategy=megatron cannot build its engine: {err}. Install megatron-core (pip install megatron-core) "
            "on every worker node, or set the role's strategy (actor_rollout_ref.actor.strategy / "
            "critic.strategy) to fsdp2"
        ) from err
    return MegatronEngine(engine_config, megatron)
