"""ModelConfig (`actor_rollout_ref.model`) and RefConfig (`actor_rollout_ref.ref`)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_like.config.actor import FSDPConfig, check_megatron_options
from verl_like.config.errors import ConfigError
from verl_like.config.megatron import MegatronConfig, canonical_strategy

# `model.path: tiny` selects the tiny Qwen2 model verl_like/models/tiny.py builds locally (no hub, no files).
BUILTIN_TINY = "tiny"


def is_builtin_model(path: str) -> bool:
    """True when `path` names the builtin tiny model rather than a directory."""
    return path == BUILTIN_TINY


@dataclass(frozen=True)
class LoraServingConfig:
    """How a LoRA policy reaches the rollout (`actor_rollout_ref.model.lora`).

    merge: false (default) sends only the adapter's tensors after each update (the base weights once) and the
      engine serves base + adapter; true merges the adapter into the base weights on the trainer and sends full
      weights through the ordinary transports (no adapter in the engine; every sync moves the whole model).
    """

    merge: bool = False


@dataclass(frozen=True)
class ModelConfig:
    """The policy model (`actor_rollout_ref.model`); the reference starts from the same weights.

    path: a local HF model directory (config.json + safetensors; no hub downloads), or "tiny" for the tiny
      builtin model built locally from `tiny_spec`.
    tiny_spec: fields of verl_like.models.tiny.TinyModelSpec overriding its defaults (hidden_size,
      num_hidden_layers, max_position_embeddings, seed, ...); only read when path is "tiny".
    tokenizer_path: where the tokenizer lives; null uses `path`.
    trust_remote_code: allow the model's own Python code (HF `trust_remote_code`; the engines, tokenizers, vLLM).
    override_config: HF config fields replaced when the model is loaded, by the FSDP engines and the rollout
      engine (e.g. {attention_dropout: 0.0}; engine/model_loading.apply_config_overrides); validation refuses a
      field the model's config lacks.
    enable_gradient_checkpointing / use_remove_padding: verl's switches; the YAML feeds them to
      `actor_rollout_ref.actor.gradient_checkpointing` / `.use_remove_padding` (and the reference's forward) by
      interpolation, so either key works.
    use_fused_kernels: verl's key, fed to `actor_rollout_ref.actor.use_fused_kernels` the same way: Triton
      kernels for the RMSNorm and SwiGLU of Qwen2/Llama-family models in the actor and reference
      (engine/fused_layers.py; CUDA and strategy=fsdp2 only). verl fuses the log-prob/entropy computation under
      this key; here that part is always fused on CUDA (engine/token_log_probs.py). null (default, "auto"): on
      when trainer.device=cuda, actor.strategy=fsdp2 and the model's model_type is one the fused layers serve
      (config/fused_kernels.py: qwen2, qwen3, llama, mistral), off otherwise; decided once when the config is
      loaded, the reason logged. true/false are used as given (true where it cannot run is refused).

    LoRA (verl's keys; docs/lora.md)
      lora_rank: rank of the PEFT LoRA adapters the actor trains; 0 (default) trains every weight. With a rank
        the base weights stay frozen, only the adapters get gradients and optimizer state, the reference is the
        actor with its adapter disabled, and checkpoints hold the adapter alone.
      lora_alpha: LoRA's alpha (the adapter's update is scaled by lora_alpha / lora_rank).
      target_modules: "all-linear" (every Linear of the decoder but the head) or a list of module names
        (e.g. [q_proj, v_proj]).
      exclude_modules: module names (or a regex string) kept out of the adapter; null excludes none.
      lora_adapter_path: a PEFT adapter directory (adapter_config.json + weights) to start from; its rank and
        targets win over lora_rank / target_modules.
      lora: LoraServingConfig (lora.merge: merged full weights instead of the adapter for the rollout).
    """

    path: str = BUILTIN_TINY
    tiny_spec: Mapping[str, Any] = field(default_factory=dict)
    tokenizer_path: str | None = None
    trust_remote_code: bool = False
    override_config: Mapping[str, Any] = field(default_factory=dict)
    enable_gradient_checkpointing: bool = False
    use_remove_padding: bool = False
    use_fused_kernels: bool | None = None
    lora_rank: int = 0
    lora_alpha: int = 16
    target_modules: str | tuple[str, ...] = "all-linear"
    exclude_modules: str | tuple[str, ...] | None = None
    lora_adapter_path: str | None = None
    lora: LoraServingConfig = field(default_factory=LoraServingConfig)

    def __post_init__(self) -> None:
        p = "actor_rollout_ref.model"
        if self.lora_rank < 0:
            raise ConfigError(f"{p}.lora_rank={self.lora_rank} must be >= 0 (0 turns LoRA off)")
        if self.lora_rank and self.lora_alpha <= 0:
            raise ConfigError(f"{p}.lora_alpha={self.lora_alpha} must be > 0 with lora_rank={self.lora_rank}")
        if self.lora_adapter_path and not self.lora_rank:
            raise ConfigError(
                f"{p}.lora_adapter_path is set but lora_rank=0; set lora_rank to the adapter's rank (LoRA training)"
            )
        if isinstance(self.target_modules, tuple) and not self.target_modules:
            raise ConfigError(f"{p}.target_modules is empty; use 'all-linear' or name the modules to adapt")
        if not self.path:
            raise ConfigError("actor_rollout_ref.model.path is empty; set a local HF model directory or 'tiny'")
        if self.tiny_spec and not is_builtin_model(self.path):
            raise ConfigError(
                f"actor_rollout_ref.model.tiny_spec is set but model.path={self.path!r} is not 'tiny'; "
                "remove tiny_spec or set actor_rollout_ref.model.path=tiny"
            )

    @property
    def is_builtin(self) -> bool:
        """True for the builtin tiny model."""
        return is_builtin_model(self.path)

    @property
    def lora_enabled(self) -> bool:
        """True when the actor trains a LoRA adapter (lora_rank > 0)."""
        return self.lora_rank > 0

    @property
    def tokenizer_dir(self) -> str:
        """tokenizer_path, or the model path when unset."""
        return self.tokenizer_path or self.path


def max_position_embeddings(model: ModelConfig) -> int | None:
    """The model's context limit: tiny_spec's (or TinyModelSpec's default), else config.json's; None if unknown.

    `override_config.max_position_embeddings` wins over both, as it does when the model is built.
    """
    if "max_position_embeddings" in model.override_config:
        return int(model.override_config["max_position_embeddings"])
    if model.is_builtin:
        return tiny_model_spec(model).max_position_embeddings
    config_file = Path(model.path).expanduser() / "config.json"
    if not config_file.is_file():
        return None
    hf_config = json.loads(config_file.read_text())
    value = hf_config.get("max_position_embeddings")
    return int(value) if isinstance(value, int) else None


def hf_model_type(model: ModelConfig, data: Any = None) -> str | None:
    """The policy's HF `model_type`: config.json's, "qwen2" for the builtin tiny model (or None when `data`, the
    DataConfig, trains it on a synthetic image task: the builtin vision-language model); None if unreadable."""
    if model.is_builtin:
        from verl_like.config.vision import synthetic_image_task

        files = [] if data is None else [data.train_files] if isinstance(data.train_files, str) else data.train_files
        for path in files:
            try:
                if path.startswith("synthetic:") and synthetic_image_task(path):
                    return None
            except ValueError:  # an unknown task: validation names it
                continue
        return "qwen2"
    config_file = Path(model.path).expanduser() / "config.json"
    try:
        value = json.loads(config_file.read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):  # no file, not JSON, not a JSON object
        return None
    return value if isinstance(value, str) else None


def tiny_model_spec(model: ModelConfig) -> Any:
    """The TinyModelSpec `model.tiny_spec` describes; ConfigError naming the key for an unknown field or value."""
    from verl_like.models.tiny import TinyModelSpec

    names = {f.name for f in dataclasses.fields(TinyModelSpec)}
    for key in model.tiny_spec:
        if key not in names:
            raise ConfigError(
                f"unknown config key 'actor_rollout_ref.model.tiny_spec.{key}'; TinyModelSpec fields are: "
                f"{', '.join(sorted(names))}"
            )
    try:
        return TinyModelSpec(**dict(model.tiny_spec))
    except (TypeError, ValueError) as err:
        raise ConfigError(f"actor_rollout_ref.model.tiny_spec: {err}") from err


@dataclass(frozen=True)
class RefConfig:
    """The reference policy's log-prob pass (`actor_rollout_ref.ref`); used when a KL term needs it.

    log_prob_micro_batch_size_per_gpu: samples per forward on one rank.
    log_prob_use_dynamic_bsz / log_prob_max_token_len_per_gpu: micro-batches by token budget instead; the budget
      null (auto) is sized like the actor's (ActorConfig), for a forward without gradients.
    fsdp_config: FSDP options of the reference copy: model_dtype, param_dtype, reduce_dtype, param_offload (keeps
      it in CPU memory between uses), reshard_after_forward. It has no optimizer: optimizer_offload must be false.
    strategy: the reference's engine; it follows actor_rollout_ref.actor.strategy (null, or the same value;
      another value is refused by ActorRolloutRefConfig).
    megatron: the reference's MegatronConfig with strategy=megatron; null takes the actor's (the YAML interpolates
      each key from actor_rollout_ref.actor.megatron, so one key can differ).
    """

    log_prob_micro_batch_size_per_gpu: int = 8
    log_prob_use_dynamic_bsz: bool = False
    log_prob_max_token_len_per_gpu: int | None = None
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    strategy: str | None = None
    megatron: MegatronConfig | None = None

    def __post_init__(self) -> None:
        p = "actor_rollout_ref.ref"
        if self.strategy is not None:
            try:
                object.__setattr__(self, "strategy", canonical_strategy(f"{p}.strategy", self.strategy))
                if self.megatron is not None:
                    self.megatron.check(f"{p}.megatron")
                if self.strategy == "megatron":
                    check_megatron_options(p, self.fsdp_config, use_remove_padding=False)
            except ValueError as err:
                raise ConfigError(str(err)) from err
        if self.log_prob_micro_batch_size_per_gpu < 1:
            raise ConfigError(
                f"{p}.log_prob_micro_batch_size_per_gpu={self.log_prob_micro_batch_size_per_gpu} must be >= 1"
            )
        if self.log_prob_max_token_len_per_gpu is not None and self.log_prob_max_token_len_per_gpu < 1:
            raise ConfigError(f"{p}.log_prob_max_token_len_per_gpu={self.log_prob_max_token_len_per_gpu} must be >= 1")
        self.fsdp_config.validate(f"{p}.fsdp_config")
        if self.fsdp_config.optimizer_offload:
            raise ConfigError(
                f"{p}.fsdp_config.optimizer_offload=true but the reference policy has no optimizer; set it to false"
            )
