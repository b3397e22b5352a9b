"""The teacher role of on-policy distillation: its model directory (built for the embedded task) and RoleSpec."""

from __future__ import annotations

from pathlib import Path

from verl_like.config.distillation import BUILTIN_TEACHER
from verl_like.config.ppo import PPOConfig
from verl_like.single_controller import RoleSpec


def resolve_teacher_path(config: PPOConfig, cache_dir: Path) -> str:
    """distillation.teacher.path as a local directory; "tiny_teacher" builds (once, under `cache_dir`) the builtin
    model fine-tuned on the synthetic task's correct answers only (the warm start with demo_accuracy=1)."""
    path = config.distillation.teacher.path
    if path != BUILTIN_TEACHER:
        return str(Path(str(path)).expanduser())
    from verl_like.config.model import tiny_model_spec
    from verl_like.data.synthetic import SYNTHETIC_PREFIX, parse_synthetic_spec
    from verl_like.models.warmstart import WarmStartSpec, build_warmstart_model

    train = config.data.train_files
    first = train if isinstance(train, str) else train[0]
    task = parse_synthetic_spec(first)[0] if first.startswith(SYNTHETIC_PREFIX) else WarmStartSpec().task
    spec = WarmStartSpec(model=tiny_model_spec(config.actor_rollout_ref.model), task=task, demo_accuracy=1.0)
    return str(build_warmstart_model(cache_dir, spec))


def teacher_role(config: PPOConfig, policy_tokenizer: object, cache_dir: Path) -> RoleSpec:
    """The RoleSpec of the teacher; ConfigError (before any worker starts) if its tokenizer is not the policy's."""
    from verl_like.config.tokenizer_check import check_same_tokenizer
    from verl_like.workers.teacher import TeacherWorker

    teacher = config.distillation.teacher
    path = resolve_teacher_path(config, cache_dir)
    check_same_tokenizer(
        policy_tokenizer, path, key="distillation.teacher.path", trust_remote_code=teacher.trust_remote_code
    )
    return RoleSpec(
        TeacherWorker,
        kwargs={
            "model_path": path,
            "config": config.distillation,
            "max_model_len": config.data.max_prompt_length + config.data.max_response_length + 1,
            "seed": config.data.seed,
        },
    )
