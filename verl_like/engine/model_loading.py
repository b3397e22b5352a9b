"""Builds the HF model an engine trains, by model kind, from a local directory (never the hub)."""

from __future__ import annotations

import difflib
import importlib.util
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    PretrainedConfig,
    PreTrainedModel,
)

from verl_like.engine import varlen_attention
from verl_like.engine.config import EngineConfig, torch_dtype
from verl_like.engine.vision import check_supported, is_vision_config, prepare_vision_model

logger = logging.getLogger(__name__)

# Dropout makes the engine's log-probs disagree with the rollout's and with themselves; RL fine-tuning turns it off.
_DROPOUT_FIELDS = ("attention_dropout", "hidden_dropout", "classifier_dropout", "embd_pdrop", "resid_pdrop")
# Fields transformers 5 moved: where a verl (transformers 4) override of them now goes.
_MOVED_FIELDS = {"rope_theta": "rope_parameters.rope_theta"}


def _plain(value: Any) -> Any:
    """`value` with mappings as dicts and tuples as lists (config mappings arrive frozen)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _config_fields(hf_config: PretrainedConfig) -> set[str]:
    return set(hf_config.to_dict()) | set(getattr(hf_config, "attribute_map", {}) or {})


def apply_config_overrides(
    hf_config: PretrainedConfig, overrides: Mapping[str, Any], key: str = "EngineConfig.override_config"
) -> None:
    """Sets each entry of `overrides` on `hf_config` in place (verl's `model.override_config`).

    A mapping value merges into a sub-config (recursively) or a dict-valued field (e.g. rope_parameters); any
    other value replaces the field. Raises ValueError naming `key`.<field> for a field the config lacks and for a
    nonzero dropout (the engine trains with dropout off so that its log-probs match the rollout's).
    """
    fields = _config_fields(hf_config)
    for name, value in overrides.items():
        if name not in fields:
            hint = ""
            if name in _MOVED_FIELDS and _MOVED_FIELDS[name].split(".")[0] in fields:
                hint = f"; transformers 5 keeps it in {_MOVED_FIELDS[name]}: set {key}.{_MOVED_FIELDS[name]} instead"
            else:
                close = difflib.get_close_matches(name, sorted(fields), n=3)
                hint = f"; did you mean {' / '.join(close)}?" if close else ""
            raise ValueError(f"{key}.{name}: {type(hf_config).__name__} has no field {name!r}{hint}")
        if name in _DROPOUT_FIELDS and value not in (None, 0, 0.0):
            raise ValueError(
                f"{key}.{name}={value}: the engine trains with dropout off (dropout makes its log-probs disagree "
                "with the rollout's); set it to 0.0 or remove it"
            )
        current = getattr(hf_config, name)
        if isinstance(value, Mapping) and isinstance(current, PretrainedConfig):
            apply_config_overrides(current, value, f"{key}.{name}")
        elif isinstance(value, Mapping) and isinstance(current, Mapping):
            setattr(hf_config, name, {**current, **_plain(value)})
        else:
            setattr(hf_config, name, _plain(value))


def resolved_overrides(hf_config: PretrainedConfig, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The top-level override entries as `hf_config` (already overridden) holds them: merged dict-valued fields
    in full, sub-config entries as given. For engines that replace a dict-valued field whole (vLLM's
    `hf_overrides`), so that they see what the training engine sees."""
    resolved = {}
    for name, value in overrides.items():
        current = getattr(hf_config, name)
        if isinstance(current, PretrainedConfig) or not isinstance(current, Mapping):
            resolved[name] = _plain(value)
        else:
            resolved[name] = _plain(current)
    return resolved


def load_hf_config(
    path: str | os.PathLike,
    *,
    trust_remote_code: bool = False,
    override_config: Mapping[str, Any] | None = None,
    key: str = "EngineConfig.override_config",
) -> PretrainedConfig:
    """AutoConfig of the local directory `path` with `override_config` applied (apply_config_overrides)."""
    hf_config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    apply_config_overrides(hf_config, override_config or {}, key)
    return hf_config


def pick_attn_implementation(requested: str | None, packed: bool = False) -> str:
    """`requested`; else flash_attention_2 when the flash_attn package is importable; else, for packed sequences
    on CUDA with torch's varlen FlashAttention, "varlen"; else sdpa (which packs through a dense mask)."""
    if requested is not None:
        return requested
    if importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "varlen" if packed and varlen_attention.torch_varlen_available() else "sdpa"


def transformers_attn_implementation(name: str) -> str:
    """The name transformers knows `name` by ("varlen" is ours, registered on first use)."""
    return varlen_attention.register() if name == "varlen" else name


def decoder_layer_classes(model: PreTrainedModel) -> tuple[type, ...]:
    """The classes of the repeated blocks FSDP shards one by one (HF's `_no_split_modules`)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    classes = tuple({type(m) for m in model.modules() if type(m).__name__ in names})
    if not classes:
        raise ValueError(
            f"{type(model).__name__} declares no `_no_split_modules` found among its modules (got {sorted(names)}); "
            "the FSDP engine shards each decoder layer and needs to know their class"
        )
    return classes


def load_model(config: EngineConfig) -> PreTrainedModel:
    """The model of `config.model_kind` in `config.dtype` on the CPU, dropout off, training mode."""
    path = Path(config.model_path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"EngineConfig.model_path={config.model_path!r} holds no config.json; point it at a local HF model "
            "directory (e.g. one written by verl_like.models.tiny.build_tiny_model or save_pretrained)"
        )
    hf_config = load_hf_config(
        path, trust_remote_code=config.trust_remote_code, override_config=config.overrides
    )
    for name in _DROPOUT_FIELDS:
        if isinstance(getattr(hf_config, name, None), float):
            setattr(hf_config, name, 0.0)
    # Token classifiers fall back to dropout 0.1 when the config has no classifier_dropout.
    hf_config.classifier_dropout = 0.0
    kwargs = {
        "config": hf_config,
        "trust_remote_code": config.trust_remote_code,
        "dtype": torch_dtype(config.dtype),
        "attn_implementation": transformers_attn_implementation(
            pick_attn_implementation(config.attn_implementation, packed=config.use_remove_padding)
        ),
    }
    # Heads missing from the checkpoint (value / score) are initialised from torch's RNG: the same seed on
    # every rank gives the same head, which FSDP then shards.
    torch.manual_seed(config.seed)
    vision = is_vision_config(hf_config)
    if vision and config.model_kind == "causal_lm":
        from transformers import AutoModelForImageTextToText

        check_supported(hf_config)
        model = AutoModelForImageTextToText.from_pretrained(path, **kwargs)
        prepare_vision_model(model, config.freeze_vision_tower)
    elif config.model_kind == "causal_lm":
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    else:
        hf_config.num_labels = 1
        if config.model_kind == "sequence_classifier" and hf_config.pad_token_id is None:
            # Scores are pooled by the engine at the last valid token (model_outputs); HF's own pooling, whose
            # result is discarded, refuses batches > 1 without a pad id, so give it one.
            hf_config.pad_token_id = hf_config.eos_token_id if isinstance(hf_config.eos_token_id, int) else 0
        auto = AutoModelForTokenClassification if config.model_kind == "value" else AutoModelForSequenceClassification
        model = auto.from_pretrained(path, **kwargs)
        if not isinstance(getattr(model, "score", None), torch.nn.Linear):
            raise ValueError(
                f"{type(model).__name__} has no `score` Linear head; model_kind={config.model_kind!r} supports the "
                "decoder families whose token / sequence classifiers name their head `score` (Qwen2, Llama, ...)"
            )
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    if config.fused_kernels:
        _apply_fused_kernels(model)
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    if config.override_config:
        logger.info("model config overrides applied: %s", config.overrides)
    logger.info(
        "loaded %s (%s) from %s: %.1fM parameters, dtype %s, attention %s",
        type(model).__name__, config.model_kind, path, sum(p.numel() for p in model.parameters()) / 1e6,
        config.dtype, model.config._attn_implementation,
    )
    return model


def _apply_fused_kernels(model: torch.nn.Module) -> None:
    """Swaps in engine/fused_layers.py's Triton RMSNorm and SwiGLU; refuses a device or model they cannot serve."""
    from verl_like.engine.fused_layers import MLP_CLASSES, RMSNORM_CLASSES, apply_fused_layers
    from verl_like.utils.device import is_cuda_available

    if not is_cuda_available():
        raise ValueError("use_fused_kernels=true runs Triton kernels on CUDA, and no CUDA device is visible; set "
                         "actor_rollout_ref.model.use_fused_kernels=false")
    counts = apply_fused_layers(model)
    if not counts["rms_norm"] and not counts["mlp"]:
        raise ValueError(
            f"use_fused_kernels=true found no supported layer in {type(model).__name__} (RMSNorm: "
            f"{', '.join(RMSNORM_CLASSES)}; SiLU MLP: {', '.join(MLP_CLASSES)}); set "
            "actor_rollout_ref.model.use_fused_kernels=false"
        )
    logger.info("fused kernels: %d RMSNorm and %d MLP modules", counts["rms_norm"], counts["mlp"])
