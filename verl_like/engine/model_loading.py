"""Builds the HF model an engine trains, by model kind, from a local directory (never the hub)."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    PreTrainedModel,
)

from verl_like.engine import varlen_attention
from verl_like.engine.config import EngineConfig, torch_dtype

logger = logging.getLogger(__name__)

# Dropout makes the engine's log-probs disagree with the rollout's and with themselves; RL fine-tuning turns it off.
_DROPOUT_FIELDS = ("attention_dropout", "hidden_dropout", "classifier_dropout", "embd_pdrop", "resid_pdrop")


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
    hf_config = AutoConfig.from_pretrained(path)
    for name in _DROPOUT_FIELDS:
        if isinstance(getattr(hf_config, name, None), float):
            setattr(hf_config, name, 0.0)
    # Token classifiers fall back to dropout 0.1 when the config has no classifier_dropout.
    hf_config.classifier_dropout = 0.0
    kwargs = {
        "config": hf_config,
        "dtype": torch_dtype(config.dtype),
        "attn_implementation": transformers_attn_implementation(
            pick_attn_implementation(config.attn_implementation, packed=config.use_remove_padding)
        ),
    }
    # Heads missing from the checkpoint (value / score) are initialised from torch's RNG: the same seed on
    # every rank gives the same head, which FSDP then shards.
    torch.manual_seed(config.seed)
    if config.model_kind == "causal_lm":
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
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    logger.info(
        "loaded %s (%s) from %s: %.1fM parameters, dtype %s, attention %s",
        type(model).__name__, config.model_kind, path, sum(p.numel() for p in model.parameters()) / 1e6,
        config.dtype, model.config._attn_implementation,
    )
    return model
