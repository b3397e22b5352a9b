"""Reward nodes: `reward_model` (rule scoring, an optional reward-model role, DAPO's overlong buffer) and
`custom_reward_function`."""

from __future__ import annotations

from dataclasses import dataclass, field

from verl_like.config.actor import FSDPConfig
from verl_like.config.errors import ConfigError
from verl_like.config.megatron import canonical_strategy
from verl_like.config.names import ERROR_POLICIES

# "naive": each response's score sits on its last valid token (verl_like/rewards/manager.py).
REWARD_MANAGERS = ("naive",)
# How the reward model's score meets the rule score: "add" sums them, "replace" uses the RM score alone (verl's
# naive reward manager: when rm_scores are present it returns them and calls no rule scorer).
RM_COMBINE_MODES = ("add", "replace")


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
    """`reward_model.model`: the reward model (a sequence classifier with one output, scored at the last token).

    path: local HF directory of a sequence-classification reward model. It must use the policy's tokenizer (the
      rollout's token ids are scored as they are; a different vocabulary is refused before any worker starts).
    trust_remote_code: let transformers run the model directory's own code (config, model and tokenizer); the
      engine still needs a classifier whose head is a Linear named `score`.
    use_remove_padding: pack the valid tokens of a micro-batch into one row (no padding in the forward pass).
    fsdp_config: FSDPConfig of the reward model (model_dtype, param_dtype, reduce_dtype, param_offload,
      reshard_after_forward; it has no optimizer, so optimizer_offload must stay false).
    """

    path: str | None = None
    trust_remote_code: bool = False
    use_remove_padding: bool = False
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)

    def __post_init__(self) -> None:
        p = "reward_model.model.fsdp_config"
        self.fsdp_config.validate(p)
        if self.fsdp_config.optimizer_offload:
            raise ConfigError(
                f"{p}.optimizer_offload=true but the reward model is inference-only (no optimizer); set it to false"
            )


@dataclass(frozen=True)
class RewardModelConfig:
    """How responses are scored (`reward_model`).

    Rule scoring (always on; selected per row by its data source, or by custom_reward_function)
      reward_manager: how scores become token-level rewards: "naive" (the score at the last response token).
      scoring_workers: processes scoring in parallel; 0 scores in the driver process.
      scoring_timeout_s: a scorer call running longer fails that sample (counted in reward/timeouts).
      error_policy: what a failed sample (the scorer raised, returned NaN/inf or a non-number, timed out, or its
        data_source has no scorer; counted in reward/errors and val/reward/errors) does to the run:
        "fail" (default) scores it 0 but stops the run when more than max_error_fraction of a batch failed,
        naming the first failure; "zero" scores it 0 and goes on (verl's behaviour); "skip" leaves it out of
        the update and of the validation mean, and stops the run past max_error_fraction like "fail".
      max_error_fraction: the share of failed samples in one batch (training or validation) that fail/skip
        tolerate; 0 stops at the first failure.
    Reward-model role (verl_like/workers/reward_model.py; one more role in each worker process, like the critic)
      enable: also score with a learned reward model ("rm_scores", one number per response on its last token).
      combine: "add" (token_level_scores = rule score + RM score) or "replace" (the RM score alone; the rule
        scorers are not called, so the data need no ground truth; verl's naive manager does this).
      model: RewardModelModelConfig. micro_batch_size_per_gpu: samples per RM forward on one rank.
      use_dynamic_bsz / forward_max_token_len_per_gpu: micro-batches by token budget instead of row count.
      strategy: "fsdp2" (verl's "fsdp" reads as fsdp2); reward models run on FSDP only, so megatron is refused.
    overlong_buffer: DAPO's overlong penalty (OverlongBufferConfig), applied after the combination.
    """

    reward_manager: str = "naive"
    scoring_workers: int = 2
    scoring_timeout_s: float = 30.0
    error_policy: str = "fail"
    max_error_fraction: float = 0.5
    enable: bool = False
    combine: str = "add"
    model: RewardModelModelConfig = field(default_factory=RewardModelModelConfig)
    micro_batch_size_per_gpu: int = 8
    use_dynamic_bsz: bool = False
    forward_max_token_len_per_gpu: int = 32768
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    strategy: str = "fsdp2"

    def __post_init__(self) -> None:
        try:
            strategy = canonical_strategy("reward_model.strategy", self.strategy)
        except ValueError as err:
            raise ConfigError(str(err)) from err
        if strategy != "fsdp2":
            raise ConfigError(
                f"reward_model.strategy={self.strategy} is not supported: reward models run on FSDP (their forward "
                "is inference-only, one FSDP2 engine per rank); set reward_model.strategy=fsdp2 or remove it"
            )
        object.__setattr__(self, "strategy", strategy)
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
        if self.error_policy not in ERROR_POLICIES:
            raise ConfigError(f"reward_model.error_policy={self.error_policy!r} must be one of {ERROR_POLICIES}")
        if not 0 <= self.max_error_fraction <= 1:
            raise ConfigError(
                f"reward_model.max_error_fraction={self.max_error_fraction} must lie in [0, 1] (0.5: stop when most "
                "of a batch failed to score)"
            )
        if self.micro_batch_size_per_gpu < 1:
            raise ConfigError(f"reward_model.micro_batch_size_per_gpu={self.micro_batch_size_per_gpu} must be >= 1")
        if self.forward_max_token_len_per_gpu < 1:
            raise ConfigError(
                f"reward_model.forward_max_token_len_per_gpu={self.forward_max_token_len_per_gpu} must be >= 1"
            )
        if self.combine not in RM_COMBINE_MODES:
            raise ConfigError(f"reward_model.combine={self.combine!r} must be one of {RM_COMBINE_MODES}")
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
