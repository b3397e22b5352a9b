"""The dry run's plan: what a validated config would start, in words (`trainer.dry_run=true` on main_ppo).

`describe_plan(config, notes)` returns the text: the roles and where they run, the devices each pool takes, the
batch sizes per rank, the algorithm, and what each verl key became or why it is ignored (the notes of
`verl_compat.translate_overrides`). `check_without_side_effects(config)` is the machine-independent part of the
preflight: data file types and their scorers, and a run directory that could be created, with nothing written.
"""

from __future__ import annotations

import os
from pathlib import Path

from verl_like.config.placement import PlacementKind
from verl_like.config.pools import cluster_processes, cluster_summary
from verl_like.config.ppo import PPOConfig
from verl_like.config.rollout_backends import rollout_backend
from verl_like.trainer.preflight import PreflightError, check_data_files, check_data_sources_have_scorers


def check_without_side_effects(config: PPOConfig) -> None:
    """The preflight checks that do not depend on this machine's devices, ports or packages, writing nothing:
    data file types, data sources with a scorer, and trainer.default_local_dir creatable (its nearest existing
    folder writable). Raises PreflightError naming the key."""
    check_data_files(config)
    check_data_sources_have_scorers(config)
    run_dir = Path(config.trainer.default_local_dir).expanduser().absolute()
    existing = run_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise PreflightError(
            f"trainer.default_local_dir={config.trainer.default_local_dir!r} cannot be created: {existing} is "
            f"{'not a folder' if not existing.is_dir() else 'not writable'}; point trainer.default_local_dir elsewhere"
        )


def _roles(config: PPOConfig) -> list[str]:
    derived, trainer = config.derived, config.trainer
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    devices = f"{trainer.nnodes} node(s) x {trainer.n_gpus_per_node} {trainer.device} worker(s)"
    lines = [f"actor ({actor.strategy}): {derived.world_size} workers on {devices}, data-parallel size "
             f"{derived.actor_dp_size}"]
    placement = config.placement
    label = rollout_backend(rollout.name).label  # config/rollout_backends.py
    if placement.kind is PlacementKind.COLOCATED:
        lines.append(f"rollout ({rollout.name}, in each actor worker): tensor-parallel {derived.rollout_tp_size}, "
                     f"{derived.rollout_dp_size} engine(s)")
    elif placement.kind is PlacementKind.USER_SERVERS:
        lines.append(f"rollout: {label} servers at {', '.join(placement.addresses)}")
    else:
        where = ("sharing the trainer's devices" if placement.shares_trainer_devices
                 else f"on rollout_pool ({placement.pool_devices} devices)")
        lines.append(f"rollout: {derived.rollout_dp_size} {label} server(s) {where}, tensor-parallel "
                     f"{derived.rollout_tp_size}")
    if derived.use_reference_policy:
        lines.append("reference policy: in each actor worker (a KL term needs it)")
    if derived.use_critic:
        where = (f"critic_pool ({config.critic_pool.world_size} workers)" if config.critic_pool.world_size
                 else "each actor worker")
        lines.append(f"critic ({config.critic.strategy}): on {where}, data-parallel size {derived.critic_dp_size}")
    if derived.use_reward_model:
        where = (f"reward_model_pool ({config.reward_model_pool.world_size} workers)"
                 if config.reward_model_pool.world_size else "each actor worker")
        lines.append(f"reward model: {config.reward_model.model.path} on {where}")
    scoring = config.reward_model.scoring_workers
    lines.append(f"rule scoring: {scoring} process(es) on the driver" if scoring else "rule scoring: in the driver")
    return lines


def _sizes(config: PPOConfig) -> list[str]:
    d, data = config.derived, config.data
    lines = [
        f"per step: {data.train_batch_size} prompts x n={config.actor_rollout_ref.rollout.n} = "
        f"{d.samples_per_step} samples, {d.mini_batches_per_step} actor mini-batch(es) per epoch",
        f"actor mini-batch: {d.ppo_mini_batch_size_samples} samples, {d.ppo_mini_batch_size_per_rank} per rank, "
        + (f"{d.micro_batches_per_mini_batch} micro-batch(es) per rank" if d.micro_batches_per_mini_batch
           else "micro-batches by token budget"),
    ]
    if d.use_critic:
        lines.append(f"critic mini-batch: {d.critic_ppo_mini_batch_size_samples} samples, "
                     f"{d.critic_ppo_mini_batch_size_per_rank} per rank")
    lines.append(f"lengths: prompt <= {data.max_prompt_length}, response <= {data.max_response_length} tokens")
    lines.append(_token_budgets(config))
    fused = config.actor_rollout_ref.actor.use_fused_kernels
    lines.append(f"fused RMSNorm/SwiGLU kernels (use_fused_kernels): {'on' if fused else 'off'}")
    return lines


def _token_budgets(config: PPOConfig) -> str:
    """How the token budgets will be set: the null keys sized at start-up, or the fallback and why."""
    from verl_like.config.actor import FALLBACK_TOKEN_BUDGET
    from verl_like.config.token_budget import auto_budget_blocker, auto_budget_passes

    passes = auto_budget_passes(config)
    if not passes:
        return "token budgets: as configured (no null budget of a token-batched pass)"
    blocker = auto_budget_blocker(config)
    if blocker is None:
        return f"token budgets of {', '.join(passes)}: sized from free device memory at start-up"
    return f"token budgets of {', '.join(passes)}: {FALLBACK_TOKEN_BUDGET} ({blocker})"


def _algorithm(config: PPOConfig) -> list[str]:
    algo, actor = config.algorithm, config.actor_rollout_ref.actor
    kl = []
    if algo.use_kl_in_reward:
        kl.append(f"KL in the reward ({algo.kl_penalty}, coef {algo.kl_ctrl.kl_coef}, {algo.kl_ctrl.type})")
    if actor.use_kl_loss:
        kl.append(f"KL loss ({actor.kl_loss_type}, coef {actor.kl_loss_coef})")
    lines = [f"advantage estimator: {algo.adv_estimator}; policy loss: {actor.policy_loss.loss_mode}, "
             f"{actor.loss_agg_mode}; {', '.join(kl) if kl else 'no KL term'}"]
    if algo.filter_groups.enable:
        lines.append(f"dynamic sampling on {algo.filter_groups.metric}, at most "
                     f"{algo.filter_groups.max_num_gen_batches} generation rounds per step")
    if config.reward_model.overlong_buffer.enable:
        buffer = config.reward_model.overlong_buffer
        lines.append(f"overlong penalty over the last {buffer.len} tokens, factor {buffer.penalty_factor}")
    return lines


def describe_plan(config: PPOConfig, notes: list[str]) -> str:
    """The dry run's report of a validated `config` (`notes`: what the verl keys became, what is ignored)."""
    trainer = config.trainer
    steps = trainer.total_training_steps or f"{trainer.total_epochs} epoch(s)"
    processes, gpus = cluster_processes(config)
    sections = {
        "roles": _roles(config),
        "cluster": [f"{processes} processes, {gpus} {trainer.device} device(s): {cluster_summary(config)}"],
        "batch sizes": _sizes(config),
        "algorithm": _algorithm(config),
        "run": [f"{steps} steps; validation every {trainer.test_freq}; checkpoints every {trainer.save_freq} in "
                f"{trainer.default_local_dir}; loggers {', '.join(trainer.logger)}"],
        "verl keys": [note for note in notes if ": ignored," not in note] or ["none translated"],
        "ignored, and why": [note.replace(": ignored,", ":") for note in notes if ": ignored," in note] or ["nothing"],
    }
    lines = ["dry run: the config is valid; nothing was started (no Ray, no directories)."]
    for title, entries in sections.items():
        lines.append(f"{title}:")
        lines.extend(f"  - {entry}" for entry in entries)
    return "\n".join(lines)
