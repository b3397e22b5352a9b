"""The warm start of the embedded image task: the tiny VLM (models/tiny_vlm.py) fine-tuned on a flawed counter.

The same recipe as the text warm start (models/warmstart.py): next-token cross-entropy on the answers of the task's
`sft` split, each the correct count with probability `demo_accuracy` and otherwise the flawed demonstrator's (one
square too many). The model learns to read the picture and prefers the flawed count, so greedy held-out reward
starts low while RL's correctness reward finds the right count among its samples. Cached in
`<cache_dir>/warmstart-vlm-<task>-<spec hash>`, built once (single process, CPU).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from verl_like.data.synthetic import generate_split
from verl_like.models.tiny_vlm import TinyVLMSpec, build_tiny_vlm
from verl_like.models.warmstart import WarmStartSpec, demonstrations, supervised_finetune

VISION_INPUTS = ("pixel_values", "pixel_attention_mask")

logger = logging.getLogger(__name__)

_SPEC_FILE = "verl_like_warmstart_spec.json"


@dataclass(frozen=True)
class VLMWarmStartSpec(WarmStartSpec):
    """WarmStartSpec (models/warmstart.py, whose `supervised_finetune` trains it) for the tiny VLM and an image
    task; a smaller batch and more steps, since reading the pictures takes longer to learn than the text tasks."""

    model: TinyVLMSpec = TinyVLMSpec()
    task: str = "count"
    demo_accuracy: float = 0.25
    steps: int = 800
    batch_size: int = 32
    lr: float = 2e-3


def sft_batch(processor, rows: list[dict], answers: list[str]) -> dict[str, torch.Tensor]:
    """Right-padded input_ids / attention_mask / loss_mask `(rows, seq_len)` of prompt + answer + eos, and the
    rows' `pixel_values` / `pixel_attention_mask` (one image each)."""
    from verl_like.data.vision import open_image

    tokenizer = processor.tokenizer
    texts, images = [], []
    for row, answer in zip(rows, answers):
        prompt = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        texts.append((prompt, answer + tokenizer.eos_token))
        images.append([open_image(row["images"][0], "sft row")])
    prompts = processor(text=[t[0] for t in texts], images=images, add_special_tokens=False, return_tensors="pt",
                        padding=True, padding_side="right")
    sequences, starts = [], []
    for ids, mask, (_, answer) in zip(prompts["input_ids"], prompts["attention_mask"], texts):
        prompt_ids = ids[mask.bool()].tolist()
        starts.append(len(prompt_ids))
        sequences.append(prompt_ids + tokenizer.encode(answer, add_special_tokens=False))
    width = max(map(len, sequences))
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    loss_mask = torch.zeros_like(input_ids)
    for i, (seq, start) in enumerate(zip(sequences, starts)):
        input_ids[i, : len(seq)] = torch.tensor(seq)
        attention_mask[i, : len(seq)] = 1
        loss_mask[i, start : len(seq)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask,
            "pixel_values": prompts["pixel_values"], "pixel_attention_mask": prompts["pixel_attention_mask"]}


def _is_built(path: Path, spec: VLMWarmStartSpec) -> bool:
    spec_file = path / _SPEC_FILE
    return spec_file.is_file() and json.loads(spec_file.read_text()).get("hash") == spec.spec_hash()


def build_vlm_warmstart(cache_dir: str | os.PathLike, spec: VLMWarmStartSpec = VLMWarmStartSpec()) -> Path:
    """Builds (once) and returns the folder of the fine-tuned tiny VLM with its tokenizer and processor."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    out_dir = Path(cache_dir) / f"warmstart-vlm-{spec.task}-{spec.spec_hash()}"
    if _is_built(out_dir, spec):
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        start = time.perf_counter()
        logger.info("VLM warm start for task %r: %d supervised steps (once; cached in %s)", spec.task, spec.steps,
                    out_dir)
        base = build_tiny_vlm(staging / "base", spec.model)
        processor = AutoProcessor.from_pretrained(base)
        torch.manual_seed(spec.model.seed)
        model = AutoModelForImageTextToText.from_pretrained(base, dtype=torch.float32)
        rows = generate_split(spec.task, "sft", spec.sft_examples, spec.seed)
        data = sft_batch(processor, rows, demonstrations(rows, spec.demo_accuracy, spec.seed))
        losses = supervised_finetune(model, data["input_ids"], data["attention_mask"], data["loss_mask"], spec,
                                     row_inputs={key: data[key] for key in VISION_INPUTS})
        final = staging / "model"
        model.to(getattr(torch, spec.model.torch_dtype)).save_pretrained(final, safe_serialization=True)
        for name in os.listdir(base):  # tokenizer, processor and generation config travel unchanged
            if not (final / name).exists():
                shutil.copy2(base / name, final / name)
        (final / _SPEC_FILE).write_text(json.dumps({"hash": spec.spec_hash(), "final_loss": losses[-1]}, indent=2))
        try:
            os.rename(final, out_dir)
        except OSError:
            if not _is_built(out_dir, spec):
                raise
        logger.info("VLM warm start: %d steps in %.1f s, loss %.3f -> %.3f, saved to %s", spec.steps,
                    time.perf_counter() - start, losses[0], losses[-1], out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def vlm_warmstart_for(model_config: Any, task: str, cache_dir: str | os.PathLike) -> Path:
    """The builtin policy (`model.path=tiny`) of an image task: its VLM warm start. `model.tiny_spec` shapes the
    text model only, so it is refused here."""
    from verl_like.config.errors import ConfigError

    if model_config.tiny_spec:
        raise ConfigError(
            f"actor_rollout_ref.model.tiny_spec={dict(model_config.tiny_spec)} shapes the tiny text model, but the "
            f"image task {task!r} trains the tiny vision-language model (models/tiny_vlm.py); remove tiny_spec"
        )
    return build_vlm_warmstart(cache_dir, VLMWarmStartSpec(task=task))
