"""Which token budgets are sized from free device memory (a null key: auto), and when sizing does not apply.

Three passes have a budget key that may be null: the actor's update (`actor.ppo_max_token_len_per_gpu`), the old
log-probs (`rollout.log_prob_max_token_len_per_gpu`) and the reference's log-probs
(`ref.log_prob_max_token_len_per_gpu`). A pass is sized when its key is null and it micro-batches by tokens
(its use_dynamic_bsz); the worker measures and sizes them (engine/token_budget.py) once the models are in place.
Sizing needs packed rows on the FSDP2 engine on CUDA with no other trained role on the same devices and no
distillation loss; otherwise,
and for every key set to a number, the configured value (16,384 for a null key) is used as it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from verl_like.config.ppo import PPOConfig

UPDATE, LOG_PROB, REF_LOG_PROB = "update", "log_prob", "ref_log_prob"
# The metric (and start-up log) name of each pass's budget.
BUDGET_METRICS = {UPDATE: "actor/token_budget", LOG_PROB: "actor/log_prob_token_budget",
                  REF_LOG_PROB: "ref/token_budget"}


def token_batched_passes(config: PPOConfig) -> dict[str, int | None]:
    """Each pass that micro-batches by tokens (its use_dynamic_bsz) and its budget key's value (None: null), in
    UPDATE, LOG_PROB, REF_LOG_PROB order. A LoRA policy's reference is the actor's engine, whose forward keeps the
    update's micro-batches: it has no pass of its own here."""
    arr = config.actor_rollout_ref
    actor, rollout, ref = arr.actor, arr.rollout, arr.ref
    passes: dict[str, int | None] = {}
    if actor.use_dynamic_bsz:
        passes[UPDATE] = actor.ppo_max_token_len_per_gpu
    if rollout.log_prob_use_dynamic_bsz:
        passes[LOG_PROB] = rollout.log_prob_max_token_len_per_gpu
    if config.derived.use_reference_policy and ref.log_prob_use_dynamic_bsz and not arr.model.lora_enabled:
        passes[REF_LOG_PROB] = ref.log_prob_max_token_len_per_gpu
    return passes


def auto_budget_passes(config: PPOConfig) -> tuple[str, ...]:
    """The token-batched passes whose budget key is null (to be sized, unless `auto_budget_blocker` says why not)."""
    return tuple(name for name, value in token_batched_passes(config).items() if value is None)


def auto_budget_blocker(config: PPOConfig) -> str | None:
    """Why the null budgets keep the fallback instead of being sized (None: they are sized)."""
    arr = config.actor_rollout_ref
    if config.trainer.device != "cuda":
        return f"trainer.device={config.trainer.device}"
    if arr.actor.strategy != "fsdp2":
        return f"actor.strategy={arr.actor.strategy} (the estimate models the FSDP2 engine)"
    if not arr.actor.use_remove_padding:
        return ("use_remove_padding=false: padded micro-batches hold more tokens than the budget counts; set "
                "actor_rollout_ref.model.use_remove_padding=true to size it")
    if config.derived.use_critic and config.critic_pool.colocated:
        return "a critic trains on the same devices (its memory is not in the estimate)"
    if config.distillation.enable:
        return "distillation.enable: its top-k log-probs copy the logits to float32 (not in the estimate)"
    return None


def longest_sequence(config: PPOConfig) -> int:
    """The most tokens one sample may hold (prompt + response): no budget may be below it."""
    rollout = config.actor_rollout_ref.rollout
    return rollout.prompt_length + rollout.response_length
