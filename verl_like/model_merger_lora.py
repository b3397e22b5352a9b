"""model_merger for a LoRA checkpoint: the adapter alone (PEFT's layout) or the base model with it merged in.

A LoRA run's checkpoint holds the adapter's parameters (and their optimizer state) only, plus
`lora_adapter/adapter_config.json` naming the base model (`base_model_name_or_path`, the run's model directory):
- `--export adapter` writes adapter_config.json + adapter_model.safetensors, which `PeftModel.from_pretrained`
  and vLLM's `LoRARequest` load;
- `--export merged` (the default) loads the base model, applies the adapter with PEFT and merges it
  (`merge_and_unload`): a plain HF model directory.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path

import torch

from verl_like.engine.fsdp_checkpoint import TOKENIZER_FILES
from verl_like.engine.lora import ADAPTER_DIR, adapter_key
from verl_like.utils.checkpoint import commit_directory, prepare_staging

logger = logging.getLogger(__name__)

EXPORTS = ("merged", "adapter")


def is_lora_checkpoint(local_dir: str | Path) -> bool:
    """True when `local_dir` is a LoRA run's checkpoint (it holds lora_adapter/adapter_config.json)."""
    return (Path(local_dir) / ADAPTER_DIR / "adapter_config.json").is_file()


def _write_adapter(folder: Path, state: dict[str, torch.Tensor], config: dict) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {adapter_key(name): tensor.contiguous() for name, tensor in state.items()}
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2))


def merge_lora_checkpoint(local_dir: str | Path, target_dir: str | Path, export: str = "merged",
                          base_model_path: str | None = None) -> Path:
    """Writes the adapter (`export="adapter"`) or the merged model of the LoRA checkpoint at `local_dir` to
    `target_dir` atomically; base_model_path overrides adapter_config.json's base_model_name_or_path."""
    from verl_like.model_merger import load_model_state

    if export not in EXPORTS:
        raise ValueError(f"--export={export!r} is not one of {EXPORTS}")
    local_dir = Path(local_dir).expanduser()
    config = json.loads((local_dir / ADAPTER_DIR / "adapter_config.json").read_text())
    base = Path(base_model_path or config.get("base_model_name_or_path") or "")
    if export == "merged" and not (base / "config.json").is_file():
        raise FileNotFoundError(
            f"the LoRA checkpoint {local_dir} names the base model {str(base)!r}, which holds no config.json; pass "
            "--base_model_path with the model directory the run trained (actor_rollout_ref.model.path)"
        )
    config["base_model_name_or_path"] = str(base)
    state = load_model_state(local_dir)
    staging = prepare_staging(target_dir)
    if export == "adapter":
        _write_adapter(staging, state, config)
    else:
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        with tempfile.TemporaryDirectory() as scratch:
            _write_adapter(Path(scratch), state, config)
            model = AutoModelForCausalLM.from_pretrained(base, dtype="auto")
            merged = PeftModel.from_pretrained(model, scratch).merge_and_unload()
        merged.save_pretrained(staging)
        for name in (*TOKENIZER_FILES, "generation_config.json"):
            if (base / name).is_file() and not (staging / name).exists():
                shutil.copy2(base / name, staging / name)
    commit_directory(staging, target_dir)
    logger.info("exported the LoRA checkpoint %s (%s, %d adapter tensors) to %s", local_dir, export, len(state),
                target_dir)
    return Path(target_dir)
