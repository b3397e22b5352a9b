"""PEFT LoRA on the training engine: wrapping the model, and the three views of it the rest of the code reads.

The engine wraps its HF model with PEFT (`apply_lora`) before sharding; the base weights are frozen, so only the
adapter's parameters get gradients and optimizer state. Parameter names then carry PEFT's prefixes
(`base_model.model.<hf name>`, `<module>.base_layer.weight`, `<module>.lora_A.default.weight`). What leaves the
engine is named for its reader:
- `base_state_iterator`: the frozen base weights under their HF names (vLLM's loader), synced into an engine once;
- `adapter_state`: the adapter under PEFT's saved names (`...q_proj.lora_A.weight`, what `save_pretrained` writes
  and vLLM's LoRA loader parses), as fresh copies: vLLM scales its B matrices in place;
- `merged_state_iterator`: W + (alpha / r) * B @ A under HF names, the policy as a plain model (merged serving,
  export, the full-weight transports).
Every iterator gathers DTensor shards with `full_tensor()`, a collective: all ranks iterate in the same order.
Linear layers only (`fan_in_fan_out` Conv1D models are refused): the merge is B @ A in the weight's layout.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from verl_like.engine.config import LoraSettings

logger = logging.getLogger(__name__)

ADAPTER_NAME = "default"
ADAPTER_DIR = "lora_adapter"  # the folder of a checkpoint that holds adapter_config.json
_PEFT_PREFIX = "base_model.model."
_ADAPTER_KEY = re.compile(rf"\.(lora_A|lora_B|lora_embedding_A|lora_embedding_B)\.{ADAPTER_NAME}(?=\.|$)")


def apply_lora(model: torch.nn.Module, settings: LoraSettings) -> torch.nn.Module:
    """`model` wrapped in a PEFT LoRA adapter (fresh from `settings`, or loaded trainable from adapter_path)."""
    from peft import LoraConfig, PeftModel, get_peft_model

    if settings.adapter_path:
        peft_model = PeftModel.from_pretrained(model, settings.adapter_path, is_trainable=True)
    else:
        targets = settings.target_modules
        excludes = settings.exclude_modules
        config = LoraConfig(
            r=settings.rank, lora_alpha=settings.alpha, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
            target_modules=targets if isinstance(targets, str) else list(targets),
            exclude_modules=excludes if excludes is None or isinstance(excludes, str) else list(excludes),
        )
        peft_model = get_peft_model(model, config)
    config = peft_model.peft_config[ADAPTER_NAME]
    if config.lora_dropout or config.fan_in_fan_out or config.use_dora or config.bias != "none":
        raise ValueError(
            f"LoRA adapter {settings.adapter_path or ''}: lora_dropout={config.lora_dropout}, fan_in_fan_out="
            f"{config.fan_in_fan_out}, use_dora={config.use_dora}, bias={config.bias!r}; the engine trains plain "
            "LoRA on Linear layers with dropout 0 (dropout makes the trainer's log-probs disagree with the rollout's)"
        )
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in peft_model.parameters())
    logger.info("LoRA r=%d alpha=%s on %s: %d trainable of %d parameters (%.2f%%)", config.r, config.lora_alpha,
                sorted(config.target_modules), trainable, total, 100.0 * trainable / total)
    return peft_model


def is_adapter_param(name: str) -> bool:
    """True for a parameter of the adapter (PEFT names them lora_A / lora_B / lora_embedding_*)."""
    return ".lora_" in name


def hf_name(peft_name: str) -> str:
    """The HF name of a base parameter under PEFT's wrapper."""
    name = peft_name.removeprefix(_PEFT_PREFIX)
    return name.replace(".base_layer.", ".")


def adapter_key(peft_name: str) -> str:
    """The name PEFT's `save_pretrained` gives an adapter parameter (the adapter name dropped)."""
    return _ADAPTER_KEY.sub(r".\1", peft_name)


def adapter_config(model: torch.nn.Module, base_model_path: str | None = None) -> dict[str, Any]:
    """The adapter's adapter_config.json as a dict (targets resolved, sets as sorted lists)."""
    config = model.peft_config[ADAPTER_NAME].to_dict()
    for key, value in config.items():
        if isinstance(value, set):
            config[key] = sorted(value)
    if base_model_path is not None:
        config["base_model_name_or_path"] = str(base_model_path)
    return config


def write_adapter_config(folder: str | Path, model: torch.nn.Module, base_model_path: str) -> None:
    """Writes adapter_config.json (PEFT's layout) into `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps(adapter_config(model, base_model_path), indent=2))


def with_adapter_config(write_hf_files: Callable[[Path], None], model: torch.nn.Module,
                        base_model_path: str) -> Callable[[Path], None]:
    """`write_hf_files` (save_fsdp_checkpoint's huggingface/ writer) that also writes the adapter's config into
    the checkpoint's lora_adapter/ folder, beside huggingface/ (model_merger reads both)."""

    def write(folder: Path) -> None:
        write_hf_files(folder)
        write_adapter_config(Path(folder).parent / ADAPTER_DIR, model, base_model_path)

    return write


def _full(param: torch.Tensor) -> torch.Tensor:
    return (param.full_tensor() if isinstance(param, DTensor) else param).detach()


def base_state_iterator(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) of every frozen base parameter. Collective."""
    for name, param in model.named_parameters():
        if not is_adapter_param(name):
            yield hf_name(name), _full(param)


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """{PEFT saved name: full tensor} of the adapter, each a copy the caller may modify. Collective."""
    return {adapter_key(name): _full(param).clone() for name, param in model.named_parameters()
            if is_adapter_param(name)}


def merged_state_iterator(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) of the policy with the adapter merged in: W + scaling * B @ A. Collective."""
    from peft.tuners.lora import LoraLayer

    layers = {name: module for name, module in model.named_modules() if isinstance(module, LoraLayer)}
    for name, param in model.named_parameters():
        if is_adapter_param(name):
            continue
        weight = _full(param)
        owner = name[: -len(".base_layer.weight")] if name.endswith(".base_layer.weight") else None
        layer = layers.get(owner) if owner is not None else None
        if layer is not None and ADAPTER_NAME in layer.lora_A:
            lora_a = _full(layer.lora_A[ADAPTER_NAME].weight).float()
            lora_b = _full(layer.lora_B[ADAPTER_NAME].weight).float()
            weight = (weight.float() + layer.scaling[ADAPTER_NAME] * (lora_b @ lora_a)).to(weight.dtype)
        yield hf_name(name), weight


@contextlib.contextmanager
def adapter_disabled(model: torch.nn.Module) -> Iterator[None]:
    """The base model's forward inside: the reference policy is the actor with its adapter off."""
    with model.disable_adapter():
        yield


def adapter_param_bytes(model: torch.nn.Module) -> tuple[int, int]:
    """(bytes of the adapter's parameters, bytes of the base's) on this rank's shards."""
    adapter = base = 0
    for name, param in model.named_parameters():
        local = param.to_local() if isinstance(param, DTensor) else param
        size = local.numel() * local.element_size()
        if is_adapter_param(name):
            adapter += size
        else:
            base += size
    return adapter, base
