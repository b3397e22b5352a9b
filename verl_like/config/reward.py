"""Reward nodes: `reward_model` (rule scoring, an optional reward-model role, DAPO's overlong buffer) and
`custom_reward_function`."""

from __future__ import annotations

from dataclasses import dataclass, field

from verl_like.config.errors import ConfigError

# "naive": each response's score sits on its last valid token (verl_like/rewards/manager.py).
REWARD_MANAGERS = ("naive",)


@dataclass(frozen=True)
class OverlongBufferConfig:
    """DAPO's soft overlong penalty (`reward_model.overlong_buffer`; formula in docs/algorithms.md).

    enable: add the penalty to each response's reward. len: the buffer B before data.max_response_length where
    the penalty ramps from 0 to -penalty_factor; must lie in (0, data.max_response_length].
    penalty_factor: f, the penalty at and beyond the limit.
    """

    enable: bool = False
    len: int = 4096
    penalty_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.len < 1:
            raise ConfigError(f"reward_model.overlong_buffer.len={self.len} must be >= 1")
        if not self.penalty_factor >= 0:
            raise ConfigError(f"reward_model.overlong_buffer.penalty_factor={self.penalty_factor} must be >= 0")


@dataclass(frozen=True)
class RewardModelModelConfig:
    """`reward_model.model`: path: local HF directory of a sequence-classification reward model;
    trust_remote_code: as for the policy."""

    path: str | None = None
    trust_remote_code: bool = False


@dataclass(frozen=True)
class RewardModelConfig:
    """How responses are scored (`reward_model`).

    Rule scoring (always on; selected per row by its data source, or by custom_reward_function)
      reward_manager: how scores become token-level rewards: "naive" (the score at the last response token).
      scoring_workers: processes scoring in parallel; 0 scores in the driver process.
      scoring_timeout_s: a scorer call running longer gives that sample reward 0 (counted in the metrics).
    Reward-model role
      enable: also score with a learned reward model (its score is added to the rule score).
      model: RewardModelModelConfig. micro_batch_size_per_gpu: samples per RM forward on one rank.
    overlong_buffer: DAPO's overlong penalty (OverlongBufferConfig).
    """

    reward_manager: str = "naive"
    scoring_workers: int = 2
    scoring_timeout_s: float = 30.0
    enable: bool = False
    model: RewardModelModelConfig = field(default_factory=RewardModelModelConfig)
    micro_batch_size_per_gpu: int = 8
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)

    def __post_init__(self) -> None:
        if self.reward_manager not in REWARD_MANAGERS:
            raise ConfigError(
                f"reward_model.reward_manager={self.reward_manager!r} is not available; use one of {REWARD_MANAGERS} "
                "(DAPO's overlong shaping is reward_model.overlong_buffer, a custom scorer is custom_reward_function)"
            )
        if self.scoring_workers < 0:
            raise ConfigError(
                f"reward_model.scoring_workers={self.scoring_workers} must be >= 0 (0 scores in the driver)"
            )
        if not self.scoring_timeout_s > 0:
            raise ConfigError(f"reward_model.scoring_timeout_s={self.scoring_timeout_s} must be > 0")
        if self.micro_batch_size_per_gpu < 1:
            raise ConfigError(f"reward_model.micro_batch_size_per_gpu={self.micro_batch_size_per_gpu} must be >= 1")
        if self.enable and not self.model.path:
            raise ConfigError(
                "reward_model.enable=true needs reward_model.model.path (a local reward-model directory); "
                "set it or set reward_model.enable=false"
            )


@dataclass(frozen=True)
class CustomRewardFunctionConfig:
    """A user scoring function (`custom_reward_function`) replacing the rule scorers.

    path: a Python file; null uses the builtin scorers. name: the function in it, called as
    `name(data_source, solution_str, ground_truth, extra_info) -> float | dict` (a dict must hold "score").
    """

    path: str | None = None
    name: str = "compute_score"

    def __post_init__(self) -> None:
        if self.path is not None and not self.name:
            raise ConfigError(
                "custom_reward_function.name is empty; set it to the function defined in custom_reward_function.path"
            )
        if self.path is not None and not self.path.endswith(".py"):
            raise ConfigError(f"custom_reward_function.path={self.path!r} must be a Python file (*.py)")
