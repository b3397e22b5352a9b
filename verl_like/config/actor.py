"""Frozen configs of the actor (`actor_rollout_ref.actor`) and the optimizer / FSDP nodes it shares with the critic.

Key names follow verl, and so do the units: `ppo_mini_batch_size` is global and counted in *prompts*, as the user
writes it (one mini-batch holds ppo_mini_batch_size * rollout.n samples); micro-batch sizes and token budgets are
per GPU and counted in samples. The config is never rewritten into other units: a role that needs samples per
rank is given `rollout_n` and computes them (`mini_batch_size_per_rank(dp_size, rollout_n)`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from verl_like.config.loss_options import PolicyLossConfig
from verl_like.config.megatron import MegatronConfig, canonical_strategy
from verl_like.config.names import KL_ESTIMATOR_NAMES, LOSS_AGG_MODES, LR_SCHEDULERS, POLICY_LOSS_NAMES

# The token budget of a pass whose budget key is left null (auto) until the worker sizes it from free device memory
# (engine/token_budget.py, CUDA + fsdp2), and always on CPU: verl's default.
FALLBACK_TOKEN_BUDGET = 16384

# verl writes dtypes as "fp32" / "bf16"; the engine wants torch's names.
_DTYPE_ALIASES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16"}


def _canonical_dtype(key: str, value: str | None, optional: bool) -> str | None:
    if value is None and optional:
        return None
    if value not in _DTYPE_ALIASES:
        allowed = sorted(_DTYPE_ALIASES) + (["null"] if optional else [])
        raise ValueError(f"{key}={value!r} is not a known dtype; use one of {allowed}")
    return _DTYPE_ALIASES[value]


@dataclass(frozen=True)
class OptimConfig:
    """AdamW and its learning-rate schedule (`<role>.optim`).

    lr, weight_decay, betas, eps: AdamW's.
    lr_warmup_steps: linear warmup steps; negative (verl's -1) means "use lr_warmup_steps_ratio".
    lr_warmup_steps_ratio: warmup as a fraction of the run's optimizer steps (needs total_training_steps).
    lr_scheduler_type: "constant" or "cosine" after warmup; cosine decays to min_lr_ratio * lr at the last step.
    min_lr_ratio: floor of the cosine schedule, in [0, 1].
    The role config that holds this node validates it (`validate`), so errors name the full key.
    """

    lr: float = 1e-6
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    lr_warmup_steps: int = -1
    lr_warmup_steps_ratio: float = 0.0
    lr_scheduler_type: str = "constant"
    min_lr_ratio: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "betas", tuple(self.betas))

    def validate(self, p: str) -> None:
        """Raises a ValueError naming `p`.<key> (p: this node's dotted path) for an invalid value."""
        if not self.lr >= 0:
            raise ValueError(f"{p}.lr={self.lr} must be >= 0")
        if not self.weight_decay >= 0:
            raise ValueError(f"{p}.weight_decay={self.weight_decay} must be >= 0")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"{p}.betas={list(self.betas)} must be two numbers in [0, 1), e.g. [0.9, 0.999]")
        if not self.eps > 0:
            raise ValueError(f"{p}.eps={self.eps} must be > 0")
        if not 0.0 <= self.lr_warmup_steps_ratio < 1.0:
            raise ValueError(f"{p}.lr_warmup_steps_ratio={self.lr_warmup_steps_ratio} must lie in [0, 1)")
        if self.lr_scheduler_type not in LR_SCHEDULERS:
            raise ValueError(f"{p}.lr_scheduler_type={self.lr_scheduler_type!r} must be one of {LR_SCHEDULERS}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"{p}.min_lr_ratio={self.min_lr_ratio} must lie in [0, 1]")

    def warmup_steps(self, total_training_steps: int | None, p: str) -> int:
        """Warmup steps: `lr_warmup_steps` when >= 0, else `lr_warmup_steps_ratio * total_training_steps`."""
        if self.lr_warmup_steps >= 0:
            return self.lr_warmup_steps
        if self.lr_warmup_steps_ratio == 0.0:
            return 0
        if total_training_steps is None:
            raise ValueError(
                f"{p}.lr_warmup_steps_ratio={self.lr_warmup_steps_ratio} needs the run's number of optimizer "
                f"steps; pass total_training_steps, or set {p}.lr_warmup_steps instead"
            )
        return int(self.lr_warmup_steps_ratio * total_training_steps)


@dataclass(frozen=True)
class FSDPConfig:
    """FSDP2 options of one model (`<role>.fsdp_config`).

    model_dtype: dtype of the stored parameters and AdamW state: "float32"/"fp32" or "bfloat16"/"bf16".
    param_dtype / reduce_dtype: mixed precision (compute in param_dtype, reduce gradients in reduce_dtype);
      null keeps model_dtype. Typical on GPU: model_dtype fp32, param_dtype bf16, reduce_dtype fp32.
    param_offload / optimizer_offload: move parameters / optimizer state to CPU memory between phases.
    offload_policy: FSDP2's CPUOffloadPolicy: parameters, gradients and optimizer state live in (pinned) CPU
      memory all the time; each layer's parameters are copied to the GPU for its forward and backward, and the
      optimizer steps on the CPU. For models whose fp32 weights, gradients and AdamW state do not fit the GPUs
      (a 7B model on one GPU); slower than param_offload / optimizer_offload, which it makes unnecessary.
    reshard_after_forward: free gathered parameters after each layer's forward (less memory, more traffic).
    The role config that holds this node validates it (`validate`), so errors name the full key.
    With strategy=megatron only the three dtypes apply; the offload and resharding keys are FSDP's and are refused
    when set (`check_megatron_options`).
    """

    model_dtype: str = "float32"
    param_dtype: str | None = None
    reduce_dtype: str | None = None
    param_offload: bool = False
    optimizer_offload: bool = False
    offload_policy: bool = False
    reshard_after_forward: bool = True

    def __post_init__(self) -> None:
        for key in ("model_dtype", "param_dtype", "reduce_dtype"):  # verl's aliases (fp32, bf16) -> torch names
            value = getattr(self, key)
            object.__setattr__(self, key, _DTYPE_ALIASES.get(value, value))

    def validate(self, p: str) -> None:
        """Raises a ValueError naming `p`.<key> (p: this node's dotted path) for an unknown dtype."""
        _canonical_dtype(f"{p}.model_dtype", self.model_dtype, False)
        _canonical_dtype(f"{p}.param_dtype", self.param_dtype, True)
        _canonical_dtype(f"{p}.reduce_dtype", self.reduce_dtype, True)



# FSDP-only settings and the value that means "off"; with strategy=megatron any other value is refused.
# (param_offload and optimizer_offload are the role's offload switches: the megatron engine honours them too,
# moving parameters / optimizer state to CPU between phases; verl names them megatron.param_offload etc.)
_FSDP_ONLY_OPTIONS = {
    "fsdp_config.offload_policy": False,
    "fsdp_config.reshard_after_forward": True,
}


def check_megatron_options(p: str, fsdp: FSDPConfig, use_remove_padding: bool,
                           gradient_checkpointing: bool = False) -> None:
    """Refuses, naming `p`.<key>, a setting of a role trained with strategy=megatron that its engine would ignore.

    Refused: offload_policy and reshard_after_forward (FSDP's), use_remove_padding (the megatron engine runs padded
    micro-batches), gradient checkpointing (Megatron's recompute is not wired), and bf16 storage or gradient
    reduction (float32 master weights; `param_dtype: bfloat16` computes in bf16 through Megatron's mixed-precision
    optimizer, CUDA only).
    """
    for key, allowed in (("model_dtype", (None, "float32")), ("param_dtype", (None, "float32", "bfloat16")),
                         ("reduce_dtype", (None, "float32"))):
        value = getattr(fsdp, key)
        if value not in allowed:
            raise ValueError(
                f"{p}.fsdp_config.{key}={value} is not supported with strategy=megatron (the megatron engine keeps "
                f"float32 master weights and gradients, computing in param_dtype); set it to "
                f"{' or '.join(str(a).lower() for a in allowed if a)} or use strategy=fsdp2"
            )
    if gradient_checkpointing:
        raise ValueError(
            f"{p}: gradient checkpointing is not supported with strategy=megatron (Megatron's activation "
            "recompute is not wired); set actor_rollout_ref.model.enable_gradient_checkpointing=false (critic: "
            "critic.model.enable_gradient_checkpointing=false) or use strategy=fsdp2"
        )
    values = {
        "fsdp_config.offload_policy": fsdp.offload_policy,
        "fsdp_config.reshard_after_forward": fsdp.reshard_after_forward,
    }
    for key, off in _FSDP_ONLY_OPTIONS.items():
        if values[key] != off:
            raise ValueError(
                f"{p}.{key}={str(values[key]).lower()} is an FSDP setting the megatron engine does not have "
                f"({p}.strategy=megatron); set it to "
                f"{str(off).lower()} or use strategy=fsdp2"
            )
    if use_remove_padding:
        raise ValueError(
            f"{p}.use_remove_padding=true is not supported with strategy=megatron (its engine runs padded "
            f"micro-batches); set {p}.use_remove_padding=false (or actor_rollout_ref.model / critic.model's) or use "
            "strategy=fsdp2"
        )


def resolve_strategy(node: Any, p: str) -> None:
    """Canonicalises `node.strategy` in place (fsdp -> fsdp2) and checks `node.megatron` for the strategy."""
    object.__setattr__(node, "strategy", canonical_strategy(f"{p}.strategy", node.strategy))
    node.megatron.check(f"{p}.megatron")


class PPOUpdateNode(Protocol):
    """The keys the actor and critic nodes share; the helpers below work on either."""

    PREFIX: ClassVar[str]
    strategy: str
    megatron: MegatronConfig
    ppo_mini_batch_size: int
    ppo_micro_batch_size_per_gpu: int | None
    use_dynamic_bsz: bool
    ppo_max_token_len_per_gpu: int | None
    ppo_epochs: int
    grad_clip: float | None
    optim: OptimConfig
    fsdp_config: FSDPConfig
    use_remove_padding: bool
    gradient_checkpointing: bool


def check_ppo_update_node(node: PPOUpdateNode) -> None:
    """Validation shared by the actor and critic nodes; errors name `node.PREFIX`.<key>."""
    p = node.PREFIX
    resolve_strategy(node, p)
    node.optim.validate(f"{p}.optim")
    node.fsdp_config.validate(f"{p}.fsdp_config")
    if node.strategy == "megatron":
        check_megatron_options(p, node.fsdp_config, node.use_remove_padding, node.gradient_checkpointing)
    if node.ppo_mini_batch_size < 1:
        raise ValueError(f"{p}.ppo_mini_batch_size={node.ppo_mini_batch_size} must be >= 1 (samples per step)")
    micro = node.ppo_micro_batch_size_per_gpu
    if node.use_dynamic_bsz:
        if node.ppo_max_token_len_per_gpu is not None and node.ppo_max_token_len_per_gpu < 1:
            raise ValueError(
                f"{p}.ppo_max_token_len_per_gpu={node.ppo_max_token_len_per_gpu} must be >= 1 with use_dynamic_bsz"
            )
    elif micro is None:
        raise ValueError(f"{p}.ppo_micro_batch_size_per_gpu is unset; set it (e.g. 4) or set {p}.use_dynamic_bsz=true")
    if micro is not None and micro < 1:
        raise ValueError(f"{p}.ppo_micro_batch_size_per_gpu={micro} must be >= 1")
    if node.ppo_epochs < 1:
        raise ValueError(f"{p}.ppo_epochs={node.ppo_epochs} must be >= 1")
    if node.grad_clip is not None and not node.grad_clip > 0:
        raise ValueError(f"{p}.grad_clip={node.grad_clip} must be > 0, or null to report the norm without clipping")


def configured_token_budget(value: int | None) -> int:
    """A token-budget key's value, or FALLBACK_TOKEN_BUDGET where it is null (auto, before or without sizing)."""
    return FALLBACK_TOKEN_BUDGET if value is None else value


def mini_batch_size_per_rank(node: PPOUpdateNode, dp_size: int, rollout_n: int) -> int:
    """Samples of one mini-batch on each data-parallel rank: ppo_mini_batch_size * rollout_n / dp_size."""
    if rollout_n < 1 or dp_size < 1:
        raise ValueError(f"rollout_n={rollout_n} and dp_size={dp_size} must be >= 1")
    samples = node.ppo_mini_batch_size * rollout_n
    if samples % dp_size:
        raise ValueError(
            f"{node.PREFIX}.ppo_mini_batch_size={node.ppo_mini_batch_size} prompts x rollout.n={rollout_n} = "
            f"{samples} samples is not divisible by the data-parallel size {dp_size}; make ppo_mini_batch_size * n "
            f"a multiple of {dp_size}"
        )
    return samples // dp_size


@dataclass(frozen=True)
class PolicyLossOptions:
    """`actor_rollout_ref.actor.policy_loss`: loss_mode names a registered policy loss (vanilla, gspo, gpg, ...)."""

    loss_mode: str = "vanilla"

    def __post_init__(self) -> None:
        if self.loss_mode not in POLICY_LOSS_NAMES:
            raise ValueError(
                f"actor_rollout_ref.actor.policy_loss.loss_mode={self.loss_mode!r} is not registered; "
                f"choose one of {POLICY_LOSS_NAMES.names()}"
            )


@dataclass(frozen=True)
class ActorConfig:
    """`actor_rollout_ref.actor`: the policy's PPO update.

    Batches
      ppo_mini_batch_size: prompts per optimizer step over all DP ranks (ppo_mini_batch_size * rollout.n samples).
      ppo_micro_batch_size_per_gpu: samples per forward/backward on one rank (gradient accumulation); may be
        null with use_dynamic_bsz.
      use_dynamic_bsz / ppo_max_token_len_per_gpu: micro-batches by token budget instead of row count; the
        budget null (default, "auto") is sized from free device memory once the models are in place on CUDA with
        strategy=fsdp2 (engine/token_budget.py; logged, metric actor/token_budget), else FALLBACK_TOKEN_BUDGET
        (16,384); a number is used as given.
      ppo_epochs: passes over the batch per update; shuffle: shuffle the rows before each pass (the same
        permutation on every rank, seeded by data_loader_seed, the update's step and the epoch).
      recompute_old_log_prob: the old log-probs' own forward over the batch before the update. null (auto) skips it
        when the update is one optimizer step over the batch (ppo_epochs=1, ppo_mini_batch_size =
        data.train_batch_size) and nothing reads them before it (no use_kl_in_reward): that step's
        forward gives them, the rollout-vs-trainer gap and the rollout IS weights (config/old_log_prob.py, decided
        once on the driver); true always runs it; false skips it and is refused where it cannot.
    Loss
      clip_ratio: default of clip_ratio_low / clip_ratio_high when those are null.
      clip_ratio_low / clip_ratio_high: ratio clipped to [1 - low, 1 + high] (DAPO's clip-higher: high > low).
      clip_ratio_c: dual-clip bound for negative advantages (> 1), or null to disable.
      loss_agg_mode: token-mean, seq-mean-token-sum, seq-mean-token-mean or seq-mean-token-sum-norm.
      loss_scale_factor: Dr.GRPO's constant for seq-mean-token-sum-norm (null: padded response length).
      policy_loss.loss_mode: the registered policy loss.
      entropy_coeff: weight of the entropy bonus (0 skips computing entropy in the update).
      use_kl_loss / kl_loss_coef / kl_loss_type: KL to the reference policy as a loss term (needs
        "ref_log_probs" in the batch); kl_loss_type names a KL estimator (k1, k2, k3, low_var_kl, ...).
      skip_zero_advantage_rows: rows whose advantage is 0 on every response token (GRPO groups whose samples
        all got the same reward) run no forward or backward in the update when their loss is 0 whatever the
        weights: a built-in policy loss, entropy_coeff 0, no KL loss. The gradient is the same (the loss still
        divides by all the mini-batch's tokens); token-mean metrics (ppo_kl, clip fractions, the rollout gap)
        then cover the rows trained. Metric actor/skipped_row_frac. Not in verl; false trains every row.
    Optimisation
      grad_clip: global gradient-norm clip, or null to only report the norm.
      optim: OptimConfig; fsdp_config: FSDPConfig.
    Model execution
      use_remove_padding: pack sequences (no padding tokens in the forward pass).
      gradient_checkpointing: recompute decoder-layer activations in backward.
      use_fused_kernels: Triton RMSNorm and SwiGLU in the model (see ModelConfig; CUDA, fsdp2); null (auto) is
        decided once on the driver (config/fused_kernels.py) before any worker sees it.
      freeze_vision_tower: a vision-language policy's vision encoder is not trained (docs/vision.md); its
        connector and language model are. Ignored by text models. fsdp2 only.
    Engine
      strategy: "fsdp2" (default; verl's "fsdp" reads as fsdp2) or "megatron" (Megatron-core TP/PP/DP).
      megatron: MegatronConfig, the parallel layout with strategy=megatron (ignored by fsdp2).
    """

    ppo_mini_batch_size: int = 256
    ppo_micro_batch_size_per_gpu: int | None = None
    use_dynamic_bsz: bool = False
    ppo_max_token_len_per_gpu: int | None = None
    ppo_epochs: int = 1
    recompute_old_log_prob: bool | None = None
    shuffle: bool = False
    data_loader_seed: int = 0
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None
    clip_ratio_c: float | None = 3.0
    loss_agg_mode: str = "token-mean"
    loss_scale_factor: float | None = None
    policy_loss: PolicyLossOptions = field(default_factory=PolicyLossOptions)
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    skip_zero_advantage_rows: bool = True
    grad_clip: float | None = 1.0
    optim: OptimConfig = field(default_factory=OptimConfig)
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    use_remove_padding: bool = False
    gradient_checkpointing: bool = False
    use_fused_kernels: bool | None = None
    freeze_vision_tower: bool = False
    strategy: str = "fsdp2"
    megatron: MegatronConfig = field(default_factory=MegatronConfig)

    PREFIX: ClassVar[str] = "actor_rollout_ref.actor"

    def __post_init__(self) -> None:
        p = self.PREFIX
        check_ppo_update_node(self)
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(f"{p}.loss_agg_mode={self.loss_agg_mode!r} must be one of {LOSS_AGG_MODES}")
        if self.loss_scale_factor is not None:
            if self.loss_agg_mode != "seq-mean-token-sum-norm":
                raise ValueError(
                    f"{p}.loss_scale_factor is only used by loss_agg_mode='seq-mean-token-sum-norm', not "
                    f"{self.loss_agg_mode!r}; set it to null"
                )
            if not self.loss_scale_factor > 0:
                raise ValueError(f"{p}.loss_scale_factor={self.loss_scale_factor} must be > 0")
        if self.kl_loss_type not in KL_ESTIMATOR_NAMES:
            raise ValueError(f"{p}.kl_loss_type={self.kl_loss_type!r} must be one of {KL_ESTIMATOR_NAMES.names()}")
        if not self.kl_loss_coef >= 0:
            raise ValueError(f"{p}.kl_loss_coef={self.kl_loss_coef} must be >= 0")
        if not self.clip_ratio >= 0:
            raise ValueError(f"{p}.clip_ratio={self.clip_ratio} must be >= 0")
        self.policy_loss_config()  # validates the resolved clip range with the key names
        if self.freeze_vision_tower and self.strategy == "megatron":
            raise ValueError(f"{p}.freeze_vision_tower=true: the megatron engine trains text decoders only; use "
                             "strategy=fsdp2 for vision-language models")
        if self.use_fused_kernels and self.strategy == "megatron":
            raise ValueError(
                f"{p}.use_fused_kernels=true swaps layers of the HF model the fsdp2 engine trains; the megatron "
                "engine builds its own layers. Set actor_rollout_ref.model.use_fused_kernels=false or strategy=fsdp2"
            )

    def policy_loss_config(self) -> PolicyLossConfig:
        """The clip settings, with clip_ratio_low / clip_ratio_high falling back to clip_ratio."""
        low = self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low
        high = self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high
        return PolicyLossConfig(clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=self.clip_ratio_c)

    def mini_batch_size_per_rank(self, dp_size: int, rollout_n: int) -> int:
        """Samples per rank of one mini-batch (ppo_mini_batch_size * rollout_n / dp_size); raises naming the key."""
        return mini_batch_size_per_rank(self, dp_size, rollout_n)
