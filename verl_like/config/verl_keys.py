"""verl's keys that verl_like has under another name, or takes for what they mean, or refuses: one table each.

`verl_compat.translate_overrides` reads these tables. The rule: a verl key is renamed when verl_like has the same
setting under another key; it is *taken and ignored, with its reason,* only when it cannot change what is computed
(a performance or memory knob of a machinery verl_like does not have, or the value that means what always runs);
every other value is refused before anything starts, naming what is not built and what to set instead. Nothing is
accepted silently: each taken key becomes a note that the dry run prints and the run logs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_FALSE = ("false", "False", "0")
TRUE = ("true", "True", "1")
_NULL = ("null", "None", "~", "")
_ONE = ("1",)
ANY = None  # every value is taken

# verl key (or dotted prefix ending in ".") -> verl_like key (or prefix): the same setting under our name.
RENAMED = {
    "critic.model.fsdp_config.": "critic.fsdp_config.",  # verl's schema puts the critic's FSDP keys under model
    "reward_model.num_workers": "reward_model.scoring_workers",  # the reward loop's scoring processes
    "actor_rollout_ref.actor.optim.clip_grad": "actor_rollout_ref.actor.grad_clip",  # verl's megatron optim key
    "critic.optim.clip_grad": "critic.grad_clip",
    "actor_rollout_ref.actor.optim.lr_decay_style": "actor_rollout_ref.actor.optim.lr_scheduler_type",
    "critic.optim.lr_decay_style": "critic.optim.lr_scheduler_type",
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes":
        "actor_rollout_ref.rollout.update_weights_bucket_megabytes",
}
for _key in ("rank", "alpha", "target_modules", "exclude_modules"):  # verl's newer nested LoRA node
    RENAMED[f"actor_rollout_ref.model.lora.{_key}"] = f"actor_rollout_ref.model.lora_{_key}" \
        if _key in ("rank", "alpha") else f"actor_rollout_ref.model.{_key}"
for _key in ("enable", "len", "penalty_factor"):  # DAPO's reward manager's overlong buffer
    RENAMED[f"reward_model.reward_kwargs.overlong_buffer_cfg.{_key}"] = f"reward_model.overlong_buffer.{_key}"
for _role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic"):
    # the role's offload switches, which the megatron engine honours (moves between phases, engine/megatron)
    RENAMED[f"{_role}.megatron.param_offload"] = f"{_role}.fsdp_config.param_offload"
    RENAMED[f"{_role}.megatron.optimizer_offload"] = f"{_role}.fsdp_config.optimizer_offload"
    # verl's FSDP1 mixed-precision node
    RENAMED[f"{_role}.fsdp_config.mixed_precision.param_dtype"] = f"{_role}.fsdp_config.param_dtype"
    RENAMED[f"{_role}.fsdp_config.mixed_precision.reduce_dtype"] = f"{_role}.fsdp_config.reduce_dtype"


@dataclass(frozen=True)
class TakenKey:
    """A verl key verl_like takes without a key of its own: `taken` values (None: any) are dropped with `reason`
    as a note; any other value is refused with `reason` and `instead` (what to set)."""

    pattern: str  # a dotted key; `*` matches one or more key segments (actor_rollout_ref.actor, critic, ...)
    taken: tuple[str, ...] | None
    reason: str
    instead: str = "remove the key"


_ULYSSES = "Ulysses sequence parallelism is not built; only 1 (none) runs"
_GRAD_OFFLOAD = ("the megatron engine keeps its gradient buffers in GPU memory (they are zero between steps); "
                 "parameters and optimizer state offload with megatron.param_offload / optimizer_offload")

TAKEN: tuple[TakenKey, ...] = (
    # placement and worker implementation
    TakenKey("trainer.use_legacy_worker_impl", ANY,
             "verl chooses between its legacy and new worker classes; verl_like has one worker per role"),
    TakenKey("actor_rollout_ref.nccl_timeout", ANY,
             "the collectives' bounds are trainer.timeouts.* and actor_rollout_ref.rollout.weight_sync_timeout_s"),
    # FSDP knobs that do not change what is computed
    TakenKey("*.fsdp_config.fsdp_size", ("-1",),
             "FSDP2 shards each role over all of its workers (verl's -1); hybrid sharding groups (HSDP) are not "
             "built", "set it to -1 or remove it"),
    TakenKey("*.fsdp_config.forward_prefetch", ANY,
             "a prefetch of the next layer's all-gather only overlaps communication; FSDP2 here runs without it"),
    TakenKey("*.fsdp_config.use_orig_params", ANY, "FSDP2 always keeps the original parameters (an FSDP1 option)"),
    TakenKey("*.fsdp_config.mixed_precision.buffer_dtype", ("fp32", "float32"),
             "buffers stay in float32", "set it to fp32 or remove it"),
    TakenKey("*.fsdp_config.wrap_policy.min_num_params", ("0",),
             "FSDP2 wraps every decoder layer (verl's 0)", "set it to 0 or remove it"),
    # memory-only recomputation in the actor's loss
    TakenKey("actor_rollout_ref.*.entropy_checkpointing", ANY,
             "recomputing the entropy in the backward pass only saves memory; the entropy is computed with the "
             "log-probs either way"),
    TakenKey("actor_rollout_ref.*.entropy_from_logits_with_chunking", ANY,
             "chunking the entropy over the logits only saves memory; the result is the same"),
    # checkpoints: verl_like always writes model, optimizer and extra state (all three are needed to resume)
    TakenKey("actor_rollout_ref.actor.checkpoint.save_contents", ("model,optimizer,extra",),
             "checkpoints always hold the sharded model, the optimizer and the extra state (all three resume a run)",
             "remove it; for a HF directory run `python -m verl_like.model_merger` on a checkpoint"),
    TakenKey("actor_rollout_ref.actor.checkpoint.load_contents", ("model,optimizer,extra",),
             "a resume always loads the model, the optimizer and the extra state", "remove it"),
    TakenKey("critic.checkpoint.save_contents", ("model,optimizer,extra",),
             "checkpoints always hold the sharded model, the optimizer and the extra state", "remove it"),
    TakenKey("critic.checkpoint.load_contents", ("model,optimizer,extra",),
             "a resume always loads the model, the optimizer and the extra state", "remove it"),
    # profilers
    TakenKey("*.profiler.enable", _FALSE, "verl's profiler integration (nsys, NPU, torch memory) is not built",
             "remove the profiler keys"),
    TakenKey("global_profiler.tool", _NULL, "verl's profiler integration (nsys, NPU, torch memory) is not built",
             "remove the global_profiler keys"),
    # megatron knobs
    TakenKey("*.megatron.grad_offload", ANY, _GRAD_OFFLOAD),
    TakenKey("*.megatron.context_parallel_size", _ONE, "Megatron context parallelism is not built; 1 runs"),
    TakenKey("*.megatron.expert_model_parallel_size", _ONE,
             "mixture-of-experts models (expert parallelism) are not built; 1 runs"),
    TakenKey("*.megatron.expert_tensor_parallel_size", ("1", *_NULL),
             "mixture-of-experts models (expert parallelism) are not built"),
    TakenKey("*.megatron.use_mbridge", ANY,
             "the megatron engine converts the HF checkpoint at model.path itself (what mbridge does)"),
    TakenKey("*.megatron.vanilla_mbridge", ANY, "the megatron engine converts the HF checkpoint itself"),
    TakenKey("*.megatron.use_dist_checkpointing", _FALSE,
             "Megatron dist checkpoints are not read; the engine loads the HF checkpoint at model.path",
             "set it to false and point model.path at the HF checkpoint"),
    TakenKey("*.megatron.dist_checkpointing_path", _NULL, "Megatron dist checkpoints are not read",
             "remove it and point model.path at the HF checkpoint"),
    # rollout engine knobs
    TakenKey("actor_rollout_ref.rollout.data_parallel_size", _ONE,
             "the rollout's data parallelism is the workers / tensor_model_parallel_size", "remove it"),
    TakenKey("actor_rollout_ref.rollout.expert_parallel_size", _ONE, "expert parallelism is not built"),
    TakenKey("actor_rollout_ref.rollout.layered_summon", ANY,
             "the weights already reach vLLM in bounded buckets (rollout.update_weights_bucket_megabytes)"),
    TakenKey("actor_rollout_ref.rollout.multi_stage_wake_up", ANY,
             "vLLM wakes its weights before the sync and its KV cache after it, always"),
    TakenKey("actor_rollout_ref.rollout.engine_kwargs.sglang.*", ANY,
             "read only by SGLang, which verl_like does not run (rollout.name picks the engine)"),
    TakenKey("actor_rollout_ref.rollout.engine_kwargs.trtllm.*", ANY,
             "read only by TensorRT-LLM, which verl_like does not run (rollout.name picks the engine)"),
    TakenKey("actor_rollout_ref.rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache", ANY,
             "a cache of the multimodal preprocessor; verl_like's prompts are text"),
    TakenKey("actor_rollout_ref.model.fused_kernel_options.impl_backend", ("triton",),
             "use_fused_kernels runs Triton kernels", "set it to triton or remove it"),
    TakenKey("actor_rollout_ref.model.use_shm", ANY, "models are read from model.path (no copy to /dev/shm is "
             "made; the OS page cache keeps a model read once in memory); to load from shared memory, copy the "
             "model there and set model.path"),
    # data
    TakenKey("data.filter_overlong_prompts_workers", ANY, "prompts are tokenized and filtered once in the driver"),
    TakenKey("data.custom_cls.path", _NULL, "custom dataset classes are not loaded; rows are read from "
             "parquet/jsonl files", "remove it and preprocess the data into parquet (examples/data_preprocess/)"),
    TakenKey("data.custom_cls.name", ANY, "custom dataset classes are not loaded (data.custom_cls.path)"),
    # reward: verl's reward loop is our scoring pool
    TakenKey("reward_model.use_reward_loop", ANY,
             "rule scoring always runs in reward_model.scoring_workers processes (verl's reward loop; its "
             "num_workers is read as scoring_workers), with the same scores either way"),
    TakenKey("reward_model.reward_manager", ("naive", "dapo", "prime"),
             "verl_like's one manager, naive, does what verl's dapo (with reward_model.overlong_buffer) and prime "
             "(scoring in parallel processes, each under reward_model.scoring_timeout_s) managers do",
             "set reward_model.reward_manager=naive"),
    TakenKey("reward_model.reward_kwargs.overlong_buffer_cfg.log", ANY,
             "the overlong penalty's metrics are always logged"),
    TakenKey("reward_model.launch_reward_fn_async", _FALSE, "the reward is scored after generation, in the step",
             "set it to false"),
    TakenKey("reward_model.rollout.*", ANY,
             "the reward model runs as an FSDP forward on the trainer's workers (reward_model."
             "micro_batch_size_per_gpu samples each), not in a vLLM engine of its own; this engine setting has no "
             "counterpart"),
    TakenKey("reward_model.sandbox_fusion.url", _NULL,
             "sandbox-fusion code execution is not built", "score code with custom_reward_function.path instead"),
    TakenKey("reward_model.sandbox_fusion.*", ANY, "settings of the sandbox (reward_model.sandbox_fusion.url)"),
    # algorithm
    TakenKey("algorithm.use_pf_ppo", _FALSE, "PF-PPO (reward-weighted resampling of each batch) is not built",
             "set it to false"),
    TakenKey("algorithm.pf_ppo.*", ANY, "settings of PF-PPO (algorithm.use_pf_ppo)"),
    TakenKey("*.ulysses_sequence_parallel_size", _ONE, _ULYSSES),
)

# verl key -> (verl's values refused, why, what to set instead); other values go on to verl_like's own checks.
REFUSED_VALUES = {
    "actor_rollout_ref.rollout.name": (
        ("sglang", "trtllm"), "SGLang and TensorRT-LLM rollouts are not built", "set actor_rollout_ref.rollout.name=vllm"),
}


# verl key -> {verl's value: verl_like's value meaning the same}
RENAMED_VALUES = {
    # verl's DAPO compares each sequence's summed token-level score (its overlong penalty included; with
    # seq_final_reward after the KL-in-reward term): verl_like's "score" (rule + reward model + overlong penalty).
    "algorithm.filter_groups.metric": {"seq_reward": "score", "seq_final_reward": "score"},
    # verl's async mode: agent loops against vLLM on the trainer's own GPUs, asleep during the update. Here that is
    # the colocated placement: the loops send each turn to the in-process engine as a request of its own
    # (continuous batching, no lock-step turns) and the engine sleeps during the update; mode=server is for vLLM
    # servers on devices of their own.
    "actor_rollout_ref.rollout.mode": {"async": "colocate"},
}


def _matches(pattern: str, key: str) -> bool:
    """`*` matches one or more dotted segments."""
    regex = r"[^.]+(?:\.[^.]+)*".join(re.escape(part) for part in pattern.split("*"))
    return re.fullmatch(regex, key) is not None


def renamed(key: str) -> str | None:
    """Our key for verl's `key`, when it is a renamed one."""
    for old, new in RENAMED.items():
        if key == old or (old.endswith(".") and key.startswith(old)):
            return new + key[len(old):] if old.endswith(".") else new
    return None


def taken_key(key: str) -> TakenKey | None:
    """The TAKEN entry that covers `key` (exact keys before patterns), else None."""
    exact = [entry for entry in TAKEN if entry.pattern == key]
    if exact:
        return exact[0]
    return next((entry for entry in TAKEN if _matches(entry.pattern, key)), None)


def normalized(value: str) -> str:
    """A list value as `a,b,c` without brackets, quotes or spaces; other values as they are."""
    if value.startswith("[") and value.endswith("]"):
        return ",".join(v.strip().strip("'\"") for v in value[1:-1].split(",") if v.strip())
    return value
