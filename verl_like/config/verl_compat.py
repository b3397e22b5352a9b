"""verl's command lines as they are: the keys and value forms verl accepts, translated before Hydra composes.

`translate_overrides(overrides)` returns the overrides verl_like composes, and notes to log:
- `trainer.logger=console` (a string) becomes the list `[console]`;
- `trainer.default_hdfs_dir=null` is dropped; a path is refused (no HDFS copy here);
- `*.optim.warmup_style` (deprecated in verl) becomes `*.optim.lr_scheduler_type`;
- deprecated global micro-batch keys (`ppo_micro_batch_size`, `log_prob_micro_batch_size`, ...) are refused with
  the `_per_gpu` key to set instead (null is dropped);
- performance keys are taken where they mean what runs and refused otherwise, each with its reason
  (PERFORMANCE_KEYS below).

`verl_default_layer(overrides)`: when a command names data or a model and no preset, the keys it leaves unset take
verl's documented defaults (configs/trainer/verl.yaml, plus bf16 on a GPU) instead of the embedded CPU toy job's.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from verl_like.config.errors import ConfigError

logger = logging.getLogger(__name__)

VERL_PRESET = "verl"
# Keys whose presence means "this is my job", not the embedded default task.
USER_JOB_KEYS = ("data.train_files", "actor_rollout_ref.model.path")
# On a GPU verl trains in bf16 (fp32 master weights and reductions) and rolls out in bf16.
VERL_CUDA_OVERRIDES = (
    "actor_rollout_ref.rollout.dtype=bfloat16",
    "actor_rollout_ref.actor.fsdp_config.param_dtype=bfloat16",
    "actor_rollout_ref.actor.fsdp_config.reduce_dtype=float32",
    "actor_rollout_ref.ref.fsdp_config.param_dtype=bfloat16",
    "critic.fsdp_config.param_dtype=bfloat16",
    "critic.fsdp_config.reduce_dtype=float32",
    "trainer.n_gpus_per_node=8",
    "trainer.ray_init.num_cpus=null",  # Ray counts the machine's CPUs, as on the GPU presets
)
# verl's deprecated global micro-batch keys -> the per-GPU key that replaced them.
DEPRECATED_KEYS = {
    "actor_rollout_ref.actor.ppo_micro_batch_size": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size": "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.ref.log_prob_micro_batch_size": "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    "critic.ppo_micro_batch_size": "critic.ppo_micro_batch_size_per_gpu",
    "reward_model.micro_batch_size": "reward_model.micro_batch_size_per_gpu",
}
# key -> (values taken as they are, why other values are refused / what the taken values mean)
PERFORMANCE_KEYS = {
    "actor_rollout_ref.actor.use_torch_compile": (
        ("false", "False"), "the FSDP engine runs eagerly (torch.compile of the FSDP2 model is not built); set it false or remove it"),
    "actor_rollout_ref.ref.use_torch_compile": (
        ("false", "False"), "the reference runs eagerly (torch.compile is not built); set it false or remove it"),
    "actor_rollout_ref.rollout.enable_chunked_prefill": (
        ("true", "True"), "vLLM's V1 engine always chunks long prefills (verl's default, true); false cannot be honoured"),
    "actor_rollout_ref.rollout.max_num_batched_tokens": (
        (), "not wired to vLLM yet (vLLM's own token budget per step applies); remove the key"),
    "data.dataloader_num_workers": (
        None, "prompts are tokenized once into memory, so the loader needs no worker processes; the value is unused"),
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": (
        ("1",), "Ulysses sequence parallelism is not built; only 1 (none) runs"),
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size": (
        ("1",), "Ulysses sequence parallelism is not built; only 1 (none) runs"),
    "critic.ulysses_sequence_parallel_size": (
        ("1",), "Ulysses sequence parallelism is not built; only 1 (none) runs"),
}
_NULL = ("null", "None", "~", "")


def _split(override: str) -> tuple[str, str, str] | None:
    """(prefix '+'/'++'/'', key, value) of a `key=value` override; None for a preset or deletion."""
    if "=" not in override or override.startswith("~"):
        return None
    key, _, value = override.partition("=")
    prefix = key[: len(key) - len(key.lstrip("+"))]
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        value = value[1:-1]
    return prefix, key.lstrip("+"), value


def translate_overrides(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """verl's forms of `overrides` in verl_like's keys, and one note per translation (see the module doc)."""
    out: list[str] = []
    notes: list[str] = []
    for override in overrides:
        parts = _split(override)
        if parts is None:
            out.append(override)
            continue
        prefix, key, value = parts
        if key == "trainer.logger" and not value.startswith("["):
            out.append(f"{prefix}trainer.logger=[{value}]")
        elif key == "trainer.default_hdfs_dir":
            if value not in _NULL:
                raise ConfigError(
                    f"trainer.default_hdfs_dir={value}: checkpoints are not copied to HDFS; remove the key and set "
                    "trainer.default_local_dir to storage every node mounts"
                )
        elif key.endswith(".optim.warmup_style"):
            new_key = key.replace("warmup_style", "lr_scheduler_type")
            out.append(f"{prefix}{new_key}={value}")
            notes.append(f"{key} is deprecated in verl; read as {new_key}={value}")
        elif key in DEPRECATED_KEYS:
            if value not in _NULL:
                raise ConfigError(
                    f"{key}={value} is verl's deprecated global micro-batch size; set {DEPRECATED_KEYS[key]} (samples "
                    "per forward on one GPU/worker, e.g. its value divided by the number of workers) instead"
                )
        elif key in PERFORMANCE_KEYS:
            taken, reason = PERFORMANCE_KEYS[key]
            if taken is not None and value not in taken:
                raise ConfigError(f"{key}={value} is not supported: {reason}")
            notes.append(f"{key}={value}: {reason}")
        else:
            out.append(override)
    return out, notes


def names_user_job(overrides: Sequence[str]) -> bool:
    """True when the overrides name data or a model of their own (not the demo's synthetic tasks or builtin tiny
    model) and pick no preset (`+trainer=...`)."""
    pairs = [(parts[1], parts[2]) for parts in map(_split, overrides) if parts is not None]
    demo = ("synthetic:", "tiny", "[synthetic:")
    own = any(key in USER_JOB_KEYS and not value.startswith(demo) for key, value in pairs)
    return own and "trainer" not in {key for key, _ in pairs}


def verl_default_layer(overrides: Sequence[str], cuda: bool) -> list[str]:
    """The overrides that put verl's defaults under a user's job: the verl preset (and bf16 on cuda) first."""
    if not names_user_job(overrides):
        return []
    keys = {parts[1] for parts in map(_split, overrides) if parts is not None}
    validate_first = ["trainer.val_before_train=true"] if "data.val_files" in keys else []  # verl's default
    return [f"+trainer={VERL_PRESET}", *(VERL_CUDA_OVERRIDES if cuda else ()), *validate_first]
