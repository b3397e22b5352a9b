"""Frozen config of the critic (`critic`): the value model's PPO update.

Batch sizes follow the actor's convention (verl_like/config/actor.py): ppo_mini_batch_size is global and counted in
prompts (times `rollout.n` samples); micro-batch sizes are per GPU and counted in samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from verl_like.config.actor import FSDPConfig, OptimConfig, check_ppo_update_node, mini_batch_size_per_rank
from verl_like.config.megatron import MegatronConfig
from verl_like.config.names import LOSS_AGG_MODES


def _critic_optim() -> OptimConfig:
    return OptimConfig(lr=1e-5)  # critics usually train faster than the policy


@dataclass(frozen=True)
class CriticConfig:
    """`critic`: PPO value-function training.

    ppo_mini_batch_size: prompts per optimizer step over all DP ranks (ppo_mini_batch_size * rollout.n samples).
    ppo_micro_batch_size_per_gpu / use_dynamic_bsz / ppo_max_token_len_per_gpu: micro-batches per rank, by row
      count or by token budget (as the actor's).
    ppo_epochs / shuffle / data_loader_seed: passes over the batch, row shuffling before each (as the actor's).
    cliprange_value: PPO2 value clipping around the rollout-time values (> 0), or null for no clipping.
    loss_agg_mode: aggregation of the per-token value loss (token-mean, seq-mean-token-sum, ...).
    grad_clip: global gradient-norm clip, or null to only report the norm.
    optim: OptimConfig (default lr 1e-5); fsdp_config: FSDPConfig.
    use_remove_padding / gradient_checkpointing: as the actor's.
    strategy / megatron: the training engine and its parallel layout, as the actor's (the critic's world is its
      pool's: the actor's workers when colocated, critic_pool's otherwise).
    """

    ppo_mini_batch_size: int = 256
    ppo_micro_batch_size_per_gpu: int | None = None
    use_dynamic_bsz: bool = False
    ppo_max_token_len_per_gpu: int = 32768
    ppo_epochs: int = 1
    shuffle: bool = False
    data_loader_seed: int = 0
    cliprange_value: float | None = 0.5
    loss_agg_mode: str = "token-mean"
    grad_clip: float | None = 1.0
    optim: OptimConfig = field(default_factory=_critic_optim)
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    use_remove_padding: bool = False
    gradient_checkpointing: bool = False
    strategy: str = "fsdp2"
    megatron: MegatronConfig = field(default_factory=MegatronConfig)

    PREFIX: ClassVar[str] = "critic"

    def __post_init__(self) -> None:
        p = self.PREFIX
        check_ppo_update_node(self)
        if self.cliprange_value is not None and not self.cliprange_value > 0:
            raise ValueError(f"{p}.cliprange_value={self.cliprange_value} must be > 0, or null to disable clipping")
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(f"{p}.loss_agg_mode={self.loss_agg_mode!r} must be one of {LOSS_AGG_MODES}")

    def mini_batch_size_per_rank(self, dp_size: int, rollout_n: int) -> int:
        """Samples per rank of one mini-batch (ppo_mini_batch_size * rollout_n / dp_size); raises naming the key."""
        return mini_batch_size_per_rank(self, dp_size, rollout_n)
