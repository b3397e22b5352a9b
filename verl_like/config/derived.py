"""DerivedSizes: per-rank and per-step values computed once from the user's global sizes (nothing is rewritten).

verl's batch keys are global and counted in prompts (data.train_batch_size, actor.ppo_mini_batch_size,
critic.ppo_mini_batch_size); micro-batch keys are per GPU and counted in samples. Everything a worker needs in
samples or per rank has its own name here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from verl_like.config.errors import ConfigError
from verl_like.config.placement import check_whole_servers
from verl_like.config.topology import Topology

if TYPE_CHECKING:
    from verl_like.config.ppo import PPOConfig

# Estimators whose advantage needs a learned value function (hence a critic).
VALUE_ESTIMATORS = frozenset({"gae"})
# Estimators that compare the samples of one prompt: with one sample per prompt every advantage is 0.
GROUP_ESTIMATORS = frozenset({"grpo", "rloo", "reinforce_plus_plus_baseline"})


@dataclass(frozen=True)
class DerivedSizes:
    """Values computed from the config (`PPOConfig.derived`).

    world_size: processes of the actor-rollout-ref group (trainer.nnodes * trainer.n_gpus_per_node).
    topology: every role's layout (config/topology.py): world, TP/PP/DP sizes and each rank's coordinates.
    actor_dp_size / critic_dp_size: the data-parallel sizes the batches split over (world // (TP * PP) with
      strategy=megatron; the role's world with fsdp2); critic_dp_size None when no critic runs.
    rollout_tp_size / rollout_dp_size: rollout tensor-parallel size and world_size // tp (server mode: the number
      of servers).
    samples_per_step: data.train_batch_size * rollout.n sequences generated and trained on per step.
    mini_batches_per_step: optimizer steps per PPO epoch (data.train_batch_size // actor.ppo_mini_batch_size).
    ppo_mini_batch_size_samples: the actor's mini-batch in samples (ppo_mini_batch_size * rollout.n).
    ppo_mini_batch_size_per_rank: the samples of one actor mini-batch on each data-parallel rank.
    micro_batches_per_mini_batch: gradient-accumulation steps per actor mini-batch on a rank (None with
      use_dynamic_bsz, where the count follows the token budget).
    critic_*: the same three for the critic (None when no critic runs).
    use_critic / use_reference_policy / use_reward_model: which roles run. The reference runs when a KL term
      needs it (algorithm.use_kl_in_reward or actor.use_kl_loss) and for online DPO (online_dpo.enable).
    """

    world_size: int
    topology: Topology
    actor_dp_size: int
    critic_dp_size: int | None
    rollout_tp_size: int
    rollout_dp_size: int
    samples_per_step: int
    mini_batches_per_step: int
    ppo_mini_batch_size_samples: int
    ppo_mini_batch_size_per_rank: int
    micro_batches_per_mini_batch: int | None
    critic_ppo_mini_batch_size_samples: int | None
    critic_ppo_mini_batch_size_per_rank: int | None
    critic_micro_batches_per_mini_batch: int | None
    use_critic: bool
    use_reference_policy: bool
    use_reward_model: bool


def _mini_batch_split(
    node: str, mini_batch: int, micro_batch: int | None, dynamic: bool, n: int, dp_size: int, train_batch: int,
    workers: str = "the role's workers",
) -> tuple[int, int, int | None]:
    """(samples per mini-batch, samples per DP rank, micro-batches per DP rank) of one PPO update node, or
    ConfigError; dp_size: the role's data-parallel size (its world with fsdp2, world / (TP * PP) with megatron);
    workers: the keys that set the role's workers, as the user wrote them (named in the error)."""
    if mini_batch > train_batch:
        raise ConfigError(
            f"{node}.ppo_mini_batch_size={mini_batch} is larger than data.train_batch_size={train_batch} (both count "
            f"prompts); set {node}.ppo_mini_batch_size <= {train_batch}"
        )
    if train_batch % mini_batch:
        raise ConfigError(
            f"data.train_batch_size={train_batch} is not divisible by {node}.ppo_mini_batch_size={mini_batch} "
            f"(both count prompts; x actor_rollout_ref.rollout.n={n}: {train_batch * n} samples vs {mini_batch * n}); set "
            f"{node}.ppo_mini_batch_size to a divisor of {train_batch}"
        )
    samples = mini_batch * n
    if samples % dp_size:
        raise ConfigError(
            f"{node}.ppo_mini_batch_size={mini_batch} prompts x actor_rollout_ref.rollout.n={n} = {samples} samples "
            f"is not divisible by the data-parallel size {dp_size} ({workers} / ({node}.megatron's "
            f"tensor x pipeline sizes with strategy=megatron)); make ppo_mini_batch_size * n a multiple of {dp_size}, "
            "or change the workers"
        )
    per_rank = samples // dp_size
    if dynamic:
        return samples, per_rank, None
    assert micro_batch is not None  # the node's own check requires it without use_dynamic_bsz
    if per_rank % micro_batch:
        raise ConfigError(
            f"{node}.ppo_mini_batch_size={mini_batch} prompts x actor_rollout_ref.rollout.n={n} = {samples} samples is "
            f"not divisible "
            f"by data-parallel size {dp_size} x {node}.ppo_micro_batch_size_per_gpu={micro_batch} = "
            f"{dp_size * micro_batch}: each rank gets {per_rank} samples per mini-batch; set "
            f"{node}.ppo_micro_batch_size_per_gpu to a divisor of {per_rank}, or change ppo_mini_batch_size"
        )
    return samples, per_rank, per_rank // micro_batch


def uses_critic(config: PPOConfig) -> bool:
    """Whether the critic role runs: critic.enable, or (when null) whether the estimator needs values."""
    if config.online_dpo.enable:
        return False  # the DPO step uses no values (check_online_dpo refuses critic.enable=true)
    if config.critic.enable is not None:
        return config.critic.enable
    return config.algorithm.adv_estimator in VALUE_ESTIMATORS


def _workers(node: str, nnodes: int, per_node: int) -> str:
    return f"{node}.nnodes={nnodes} x {node}.n_gpus_per_node={per_node} workers"


def derive_sizes(config: PPOConfig) -> DerivedSizes:
    """The DerivedSizes of `config`; ConfigError naming the keys when the global sizes do not split evenly."""
    trainer, rollout = config.trainer, config.actor_rollout_ref.rollout
    actor = config.actor_rollout_ref.actor
    world = trainer.world_size
    tp = rollout.tensor_model_parallel_size
    use_critic = uses_critic(config)
    use_reference = config.algorithm.use_kl_in_reward or actor.use_kl_loss or config.online_dpo.enable
    topology = Topology.of(config, use_reference, use_critic)
    check_whole_servers(config)
    servers = config.placement.servers
    n, train_batch = rollout.n, config.data.train_batch_size
    samples, per_rank, micro = _mini_batch_split(
        actor.PREFIX, actor.ppo_mini_batch_size, actor.ppo_micro_batch_size_per_gpu, actor.use_dynamic_bsz, n,
        topology.actor.dp_size, train_batch, _workers("trainer", trainer.nnodes, trainer.n_gpus_per_node),
    )
    critic_sizes: tuple[int | None, int | None, int | None] = (None, None, None)
    if topology.critic is not None:
        critic = config.critic
        critic_sizes = _mini_batch_split(
            critic.PREFIX, critic.ppo_mini_batch_size, critic.ppo_micro_batch_size_per_gpu, critic.use_dynamic_bsz,
            n, topology.critic.dp_size, train_batch,
            _workers("critic_pool", config.critic_pool.nnodes, config.critic_pool.n_gpus_per_node)
            if config.critic_pool.world_size else _workers("trainer", trainer.nnodes, trainer.n_gpus_per_node),
        )
    return DerivedSizes(
        world_size=world,
        topology=topology,
        actor_dp_size=topology.actor.dp_size,
        critic_dp_size=topology.critic.dp_size if topology.critic is not None else None,
        rollout_tp_size=tp,
        rollout_dp_size=servers if topology.rollout is None else topology.rollout.dp_size,
        samples_per_step=train_batch * n,
        mini_batches_per_step=train_batch // actor.ppo_mini_batch_size,
        ppo_mini_batch_size_samples=samples,
        ppo_mini_batch_size_per_rank=per_rank,
        micro_batches_per_mini_batch=micro,
        critic_ppo_mini_batch_size_samples=critic_sizes[0],
        critic_ppo_mini_batch_size_per_rank=critic_sizes[1],
        critic_micro_batches_per_mini_batch=critic_sizes[2],
        use_critic=use_critic,
        use_reference_policy=use_reference,
        use_reward_model=config.reward_model.enable,
    )
