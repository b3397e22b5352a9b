"""DistillationConfig: the `distillation` node (on-policy distillation from a teacher's top-k log-probs)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from verl_like.config.errors import ConfigError
from verl_like.config.names import DISTILLATION_LOSSES

if TYPE_CHECKING:
    from verl_like.config.ppo import PPOConfig

# `distillation.teacher.path: tiny_teacher` builds the embedded task's teacher: the tiny model fine-tuned on the
# correct answers only (verl_like/models/warmstart.py with demo_accuracy=1).
BUILTIN_TEACHER = "tiny_teacher"


@dataclass(frozen=True)
class TeacherConfig:
    """`distillation.teacher`: the model that scores the student's samples (same tokenizer as the policy).

    path: a local HF model directory, or "tiny_teacher" (the embedded task's correct teacher, built locally).
    trust_remote_code: allow the teacher's own model code in vLLM.
    dtype: vLLM's dtype for the teacher ("float32", "bfloat16", "float16" or "auto").
    gpu_memory_utilization: the teacher engine's share of the device (GPU); on CPU its KV cache follows
      $VLLM_CPU_KVCACHE_SPACE like the rollout's.
    """

    path: str | None = None
    trust_remote_code: bool = False
    dtype: str = "float32"
    gpu_memory_utilization: float = 0.2

    def __post_init__(self) -> None:
        p = "distillation.teacher"
        if self.dtype not in ("float32", "bfloat16", "float16", "auto"):
            raise ConfigError(f"{p}.dtype={self.dtype!r} must be one of float32, bfloat16, float16, auto")
        if not 0.0 < self.gpu_memory_utilization < 1.0:
            raise ConfigError(f"{p}.gpu_memory_utilization={self.gpu_memory_utilization} must lie in (0, 1)")


@dataclass(frozen=True)
class DistillationConfig:
    """On-policy distillation (`distillation`; docs/algorithms.md): the student (the actor) samples, the teacher
    returns its top-k log-probs at every response position, and the actor's loss adds coef x the divergence.

    enable: score every rollout with the teacher and add the distillation loss (`+trainer=distill` sets it).
    teacher: TeacherConfig. top_k: teacher log-probs kept per position (1..vLLM's max_logprobs, raised to it).
    loss: "forward_kl" KL(teacher || student), "reverse_kl" KL(student || teacher) or "jsd" (beta 0.5), each
      over the teacher's top-k tokens with both distributions renormalised there.
    coef: weight of the distillation loss in the actor's loss.
    use_policy_loss: also keep the RL policy-gradient loss (mixing distillation with the reward); false trains
      on the distillation loss alone.
    """

    enable: bool = False
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    top_k: int = 8
    loss: str = "forward_kl"
    coef: float = 1.0
    use_policy_loss: bool = False

    def __post_init__(self) -> None:
        p = "distillation"
        if self.loss not in DISTILLATION_LOSSES:
            raise ConfigError(f"{p}.loss={self.loss!r} must be one of {DISTILLATION_LOSSES}")
        if self.top_k < 1:
            raise ConfigError(f"{p}.top_k={self.top_k} must be >= 1 (teacher log-probs per position)")
        if not self.coef > 0:
            raise ConfigError(f"{p}.coef={self.coef} must be > 0")
        if self.enable and not self.teacher.path:
            raise ConfigError(
                f"{p}.enable=true needs {p}.teacher.path (a local HF model directory with the policy's tokenizer, or "
                f"{BUILTIN_TEACHER!r} for the embedded task)"
            )


def check_distillation(config: PPOConfig, check_paths: bool = True) -> None:
    """ConfigError naming the keys when distillation meets a setting it cannot run with (with check_paths, also
    when distillation.teacher.path is not a model directory)."""
    if not config.distillation.enable:
        return
    if config.online_dpo.enable:
        raise ConfigError("distillation.enable and online_dpo.enable are both true; pick one trainer")
    teacher = config.distillation.teacher.path
    if teacher == BUILTIN_TEACHER and not config.actor_rollout_ref.model.is_builtin:
        raise ConfigError(
            f"distillation.teacher.path={BUILTIN_TEACHER!r} is the builtin model's teacher, but "
            f"actor_rollout_ref.model.path={config.actor_rollout_ref.model.path!r}; point the teacher at a model "
            "with the policy's tokenizer"
        )
    if check_paths and teacher != BUILTIN_TEACHER and not (Path(str(teacher)).expanduser() / "config.json").is_file():
        raise ConfigError(
            f"distillation.teacher.path={teacher!r} has no config.json; point it at a local HF model directory with "
            f"the policy's tokenizer (or {BUILTIN_TEACHER!r} for the embedded task)"
        )
