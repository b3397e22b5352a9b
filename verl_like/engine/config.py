"""EngineConfig: everything a training engine needs to build its model, optimizer and micro-batches."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from verl_like.config.names import LR_SCHEDULERS

MODEL_KINDS = ("causal_lm", "value", "sequence_classifier")
ATTN_IMPLEMENTATIONS = ("flash_attention_2", "varlen", "flex_attention", "sdpa", "eager")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a config dtype name ('float32' or 'bfloat16')."""
    return _DTYPES[name]


@dataclass(frozen=True)
class LoraSettings:
    """A PEFT LoRA adapter for the engine to train (engine/lora.py): rank, alpha, target_modules ("all-linear"
    or module names), exclude_modules (names or a regex; None), adapter_path (a PEFT adapter to start from)."""

    rank: int
    alpha: int = 16
    target_modules: str | tuple[str, ...] = "all-linear"
    exclude_modules: str | tuple[str, ...] | None = None
    adapter_path: str | None = None

    def __post_init__(self) -> None:
        if self.rank < 1 or self.alpha <= 0:
            raise ValueError(f"LoraSettings: rank={self.rank} must be >= 1 and alpha={self.alpha} > 0")


@dataclass(frozen=True)
class MicroBatching:
    """How one engine call splits a rank's rows: `micro_batch_size` rows at a time, or, with `max_tokens` set
    (dynamic batch size), balanced micro-batches of at most that many valid tokens each."""

    micro_batch_size: int
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.micro_batch_size < 1 or (self.max_tokens is not None and self.max_tokens < 1):
            raise ValueError(f"MicroBatching needs micro_batch_size >= 1 and max_tokens >= 1 or None, got {self}")


@dataclass(frozen=True)
class EngineConfig:
    """Frozen settings of one training engine (one model on one data-parallel group).

    Model
      model_path: local HF directory (no hub access) to load the weights and config from.
      model_kind: "causal_lm" (policy / reference: log-probs of response tokens), "value" (critic:
        `AutoModelForTokenClassification` with one label, i.e. the backbone plus a Linear(hidden, 1) value head,
        freshly initialised from `seed` when the checkpoint is a causal LM), or "sequence_classifier" (reward model:
        `AutoModelForSequenceClassification` with one label, scored at each sequence's last valid token).
      dtype: dtype the parameters (and so the optimizer's master weights) are stored in: "float32" or "bfloat16".
      param_dtype / reduce_dtype: FSDP mixed precision: parameters are all-gathered and computed in `param_dtype`,
        gradients reduced in `reduce_dtype`; None keeps `dtype`. Typical on GPU: dtype "float32", param_dtype
        "bfloat16", reduce_dtype "float32" (also works on CPU with gloo).
      attn_implementation: None picks "flash_attention_2" when the flash_attn package imports, else "varlen" for
        packed sequences on CUDA (torch's own varlen FlashAttention, engine/varlen_attention.py), else "sdpa".
      gradient_checkpointing: recompute each decoder layer's activations in the backward pass.
      fused_kernels: Triton RMSNorm and SwiGLU in the HF model (engine/fused_layers.py; CUDA only).
      freeze_vision_tower: a vision-language model's vision encoder gets no gradients (engine/vision.py).
      override_config: entries replacing fields of the HF model config when the model is loaded (verl's
        `model.override_config`, e.g. {"rope_parameters": {"rope_theta": 5e5}}); a mapping value merges into a
        dict-valued field or a sub-config. Stored as sorted (name, value) pairs; an unknown field or a nonzero
        dropout raises at load (model_loading.apply_config_overrides).
      trust_remote_code: let transformers run the model directory's own Python code (HF `trust_remote_code`).

    Optimizer (AdamW over all parameters)
      lr, weight_decay, betas, eps: AdamW's.
      lr_scheduler: "constant" or "cosine"; both after `warmup_steps` steps of linear warmup from lr/warmup_steps.
      total_steps: optimizer steps of the whole run; required by "cosine" (which decays to `min_lr_ratio * lr` at
        `total_steps`).
      grad_clip: clip the global gradient norm to this value; None reports the norm without clipping.

    Micro-batches (per rank; every rank runs the same number of micro-batches)
      micro_batch_size_per_rank: sequences per micro-batch when `use_dynamic_bsz` is off.
      use_dynamic_bsz / max_tokens_per_rank: micro-batches formed by valid-token count, each at most
        `max_tokens_per_rank` tokens, balanced in size.
      use_remove_padding: pack the valid tokens of a micro-batch into one row (no padding in the forward pass);
        position ids restart per sequence and the attention backend keeps sequences apart.

    Memory
      param_offload / optimizer_offload: `offload()` moves parameters / optimizer state to CPU memory between
        phases and `onload()` brings them back (on CPU the move is a no-op; with param_offload the engine refuses
        to compute between the two calls, on every device).
      offload_policy: FSDP2's CPUOffloadPolicy (parameters, gradients and optimizer state always in CPU memory,
        pinned on CUDA; each layer's parameters are copied to the device for its forward and backward; the
        optimizer steps on the CPU). `offload()` / `onload()` then move nothing.

    Other
      inference_only: build the model for forward passes only (a reference policy): no optimizer or LR
        scheduler; forward_backward, optimizer_step, current_lr and checkpoints raise.
      reshard_after_forward: FSDP frees all-gathered parameters after each layer's forward (less memory, one more
        all-gather in backward).
      seed: seeds torch before the model is built, so freshly initialised heads are the same on every rank.
      lora: LoraSettings: train a PEFT LoRA adapter on the frozen model (only its parameters get gradients and
        optimizer state; checkpoints hold it alone); None trains every weight.
    """

    model_path: str
    model_kind: str = "causal_lm"
    dtype: str = "float32"
    param_dtype: str | None = None
    reduce_dtype: str | None = None
    attn_implementation: str | None = None
    gradient_checkpointing: bool = False
    fused_kernels: bool = False
    freeze_vision_tower: bool = False
    override_config: Mapping[str, Any] | tuple[tuple[str, Any], ...] = ()
    trust_remote_code: bool = False
    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    lr_scheduler: str = "constant"
    warmup_steps: int = 0
    total_steps: int | None = None
    min_lr_ratio: float = 0.0
    grad_clip: float | None = 1.0
    micro_batch_size_per_rank: int = 1
    use_dynamic_bsz: bool = False
    max_tokens_per_rank: int | None = None
    use_remove_padding: bool = False
    param_offload: bool = False
    optimizer_offload: bool = False
    offload_policy: bool = False
    reshard_after_forward: bool = True
    seed: int = 0
    inference_only: bool = False
    lora: LoraSettings | None = None

    def __post_init__(self) -> None:
        if not self.model_path:
            raise ValueError("EngineConfig.model_path is empty; set it to a local HF model directory")
        items = self.override_config.items() if isinstance(self.override_config, Mapping) else self.override_config
        items = tuple((name, value) for name, value in items)
        for name, _ in items:
            if not isinstance(name, str) or not name:
                raise ValueError(f"EngineConfig.override_config has the key {name!r}; keys are HF config field names")
        object.__setattr__(self, "override_config", tuple(sorted(items, key=lambda item: item[0])))
        if self.model_kind not in MODEL_KINDS:
            raise ValueError(f"EngineConfig.model_kind={self.model_kind!r} is not one of {MODEL_KINDS}")
        for field in ("dtype", "param_dtype", "reduce_dtype"):
            value = getattr(self, field)
            if value is not None and value not in _DTYPES:
                raise ValueError(f"EngineConfig.{field}={value!r} is not one of {tuple(_DTYPES)}")
        if self.attn_implementation is not None and self.attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise ValueError(
                f"EngineConfig.attn_implementation={self.attn_implementation!r} is not one of "
                f"{ATTN_IMPLEMENTATIONS} (or None to choose by what is installed)"
            )
        if self.attn_implementation == "varlen" and not self.use_remove_padding:
            raise ValueError(
                "EngineConfig.attn_implementation='varlen' runs packed sequences only; set use_remove_padding=True "
                "or pick another attn_implementation"
            )
        if self.lr < 0:
            raise ValueError(f"EngineConfig.lr={self.lr} must be >= 0")
        if self.weight_decay < 0:
            raise ValueError(f"EngineConfig.weight_decay={self.weight_decay} must be >= 0")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"EngineConfig.betas={self.betas} must be two numbers in [0, 1)")
        if self.lr_scheduler not in LR_SCHEDULERS:
            raise ValueError(f"EngineConfig.lr_scheduler={self.lr_scheduler!r} is not one of {LR_SCHEDULERS}")
        if self.warmup_steps < 0:
            raise ValueError(f"EngineConfig.warmup_steps={self.warmup_steps} must be >= 0")
        if self.lr_scheduler == "cosine":
            if self.total_steps is None or self.total_steps <= self.warmup_steps:
                raise ValueError(
                    f"EngineConfig.lr_scheduler='cosine' needs total_steps > warmup_steps={self.warmup_steps}, got "
                    f"total_steps={self.total_steps}; set total_steps to the run's number of optimizer steps"
                )
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"EngineConfig.min_lr_ratio={self.min_lr_ratio} must be in [0, 1]")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise ValueError(f"EngineConfig.grad_clip={self.grad_clip} must be > 0, or None to only report the norm")
        if self.micro_batch_size_per_rank < 1:
            raise ValueError(
                f"EngineConfig.micro_batch_size_per_rank={self.micro_batch_size_per_rank} must be >= 1"
            )
        if self.inference_only and self.optimizer_offload:
            raise ValueError(
                "EngineConfig.optimizer_offload=True but inference_only=True builds no optimizer; set "
                "optimizer_offload=False"
            )
        if self.use_dynamic_bsz and (self.max_tokens_per_rank is None or self.max_tokens_per_rank < 1):
            raise ValueError(
                f"EngineConfig.use_dynamic_bsz=True needs max_tokens_per_rank >= 1, got {self.max_tokens_per_rank}"
            )

    @property
    def micro_batching(self) -> MicroBatching:
        """The micro-batching of training calls (and of forwards not given their own)."""
        return MicroBatching(self.micro_batch_size_per_rank, self.max_tokens_per_rank if self.use_dynamic_bsz else None)

    @property
    def overrides(self) -> dict[str, Any]:
        """override_config as a plain dict."""
        return dict(self.override_config)
