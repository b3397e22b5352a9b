"""OnlineDPOConfig: the `online_dpo` node, and the checks it needs from the rest of the config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from verl_like.config.errors import ConfigError
from verl_like.config.names import DPO_LOSS_TYPES, TIE_BREAKING

if TYPE_CHECKING:
    from verl_like.config.ppo import PPOConfig


@dataclass(frozen=True)
class OnlineDPOConfig:
    """Online DPO (`online_dpo`; docs/algorithms.md): the trainer step ranks each prompt's samples with the run's
    reward and trains on one (chosen, rejected) pair per prompt against the reference policy.

    enable: run the online-DPO step instead of the PPO step (`+trainer=online_dpo` sets it).
    beta: the DPO temperature (> 0): strength of the implicit KL to the reference.
    loss_type: "sigmoid" (DPO) or "ipo".
    label_smoothing: eps in [0, 0.5) of conservative DPO (sigmoid only): the share of labels assumed flipped.
    tie_breaking: when every sample of a prompt scores the same: "skip" the prompt (its pair gets no gradient) or
      pair two of its samples at "random".
    """

    enable: bool = False
    beta: float = 0.1
    loss_type: str = "sigmoid"
    label_smoothing: float = 0.0
    tie_breaking: str = "skip"

    def __post_init__(self) -> None:
        p = "online_dpo"
        if not self.beta > 0:
            raise ConfigError(f"{p}.beta={self.beta} must be > 0 (typical: 0.05 to 0.5)")
        if self.loss_type not in DPO_LOSS_TYPES:
            raise ConfigError(f"{p}.loss_type={self.loss_type!r} must be one of {DPO_LOSS_TYPES}")
        if not 0.0 <= self.label_smoothing < 0.5:
            raise ConfigError(f"{p}.label_smoothing={self.label_smoothing} must lie in [0, 0.5)")
        if self.label_smoothing > 0 and self.loss_type != "sigmoid":
            raise ConfigError(
                f"{p}.label_smoothing={self.label_smoothing} applies to loss_type='sigmoid' only; set it to 0 for "
                f"{self.loss_type!r}"
            )
        if self.tie_breaking not in TIE_BREAKING:
            raise ConfigError(f"{p}.tie_breaking={self.tie_breaking!r} must be one of {TIE_BREAKING}")


def check_online_dpo(config: PPOConfig) -> None:
    """ConfigError naming the keys when online_dpo.enable meets a setting the pair update cannot honour.

    The update keeps each (chosen, rejected) pair in adjacent rows of one micro-batch, so rows are neither
    shuffled nor packed by token budget, and every split (ranks, mini-batches, micro-batches) holds whole pairs.
    """
    if not config.online_dpo.enable:
        return
    actor = config.actor_rollout_ref.actor
    n, world = config.actor_rollout_ref.rollout.n, config.trainer.world_size
    if n < 2:
        raise ConfigError(f"online_dpo.enable=true needs actor_rollout_ref.rollout.n >= 2 (samples to rank); got {n}")
    for key, bad in (
        ("actor_rollout_ref.actor.shuffle", actor.shuffle),
        ("actor_rollout_ref.actor.use_dynamic_bsz", actor.use_dynamic_bsz),
        ("algorithm.filter_groups.enable", config.algorithm.filter_groups.enable),
        ("critic.enable", bool(config.critic.enable)),
    ):
        if bad:
            raise ConfigError(f"online_dpo.enable=true does not support {key}=true (pairs must stay whole); set it false")
    if actor.ppo_epochs != 1:
        raise ConfigError(
            f"online_dpo.enable=true takes one pass over each step's pairs; set actor_rollout_ref.actor.ppo_epochs=1 "
            f"(got {actor.ppo_epochs})"
        )
    pairs_per_rank, rem = divmod(actor.ppo_mini_batch_size, world)
    micro = actor.ppo_micro_batch_size_per_gpu
    if rem or micro is None or micro % 2 or (2 * pairs_per_rank) % micro:
        raise ConfigError(
            f"online_dpo: each rank trains on actor_rollout_ref.actor.ppo_mini_batch_size="
            f"{actor.ppo_mini_batch_size} pairs / {world} ranks per mini-batch (2 rows a pair), which must be a "
            f"whole number split into micro-batches of an even actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
            f"={micro}; make ppo_mini_batch_size a multiple of the world size and the micro-batch an even divisor of "
            "2 x ppo_mini_batch_size / world size"
        )
