"""The warm-start checkpoint of the embedded default job: the tiny model fine-tuned on a flawed demonstrator.

Real RL starts from a supervised model, and real demonstrations are imperfect. This module builds the tiny model
(verl_like/models/tiny.py) and trains it with plain next-token cross-entropy on the responses of a synthetic
task's `sft` split (disjoint from the held-out `test` split), where each demonstration is the correct answer with
probability `demo_accuracy` and otherwise the task's typical mistake (`flawed_answer`: digits sorted the wrong
way, a forgotten carry, digits copied instead of reversed). The model learns both behaviours and prefers the
flawed one: greedy held-out reward starts low, while a correct answer is sampled often enough (about
`demo_accuracy` of the time) for RL's correctness reward to find and reinforce it. The result is cached in
`<cache_dir>/warmstart-<task>-<spec hash>` and built once (single process, CPU, seconds).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from verl_like.data.synthetic import generate_split, get_task
from verl_like.models.tiny import TinyModelSpec, build_tiny_model

logger = logging.getLogger(__name__)

_SPEC_FILE = "verl_like_warmstart_spec.json"


@dataclass(frozen=True)
class WarmStartSpec:
    """What the warm start trains: model shape, task, and the supervised schedule.

    task: synthetic task whose `sft` split is the training data.
    sft_examples: rows of the sft split drawn (the fine-tune cycles over them).
    demo_accuracy: share of demonstrations that are correct; the others show the task's flaw.
    steps / batch_size / lr: AdamW steps, rows per step and peak learning rate (linear warm-up over 10% of the
        steps, then constant).
    seed: data order and dropout-free training are fixed by it (the model's init by `model.seed`).
    """

    model: TinyModelSpec = TinyModelSpec()
    task: str = "sort"
    sft_examples: int = 4096
    demo_accuracy: float = 0.3
    steps: int = 300
    batch_size: int = 64
    lr: float = 3e-3
    weight_decay: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        get_task(self.task)
        for name in ("sft_examples", "steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"WarmStartSpec.{name}={getattr(self, name)} must be >= 1")
        if not 0.0 <= self.demo_accuracy <= 1.0:
            raise ValueError(f"WarmStartSpec.demo_accuracy={self.demo_accuracy} must lie in [0, 1]")
        if not self.lr > 0:
            raise ValueError(f"WarmStartSpec.lr={self.lr} must be > 0")

    def spec_hash(self) -> str:
        """Stable hash of every field (the model spec through its own hash, which covers the tokenizer)."""
        fields = dataclasses.asdict(self)
        fields["model"] = self.model.spec_hash()
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def demonstrations(rows: list[dict], demo_accuracy: float, seed: int) -> list[str]:
    """The demonstrated answer of each sft row: its ground truth with probability `demo_accuracy` (seeded), else
    its `extra_info.flawed_answer`."""
    rng = random.Random(seed)
    return [
        row["reward_model"]["ground_truth"] if rng.random() < demo_accuracy else row["extra_info"]["flawed_answer"]
        for row in rows
    ]


def sft_tensors(
    tokenizer: PreTrainedTokenizerBase, rows: list[dict], answers: list[str]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded `input_ids`, `attention_mask` and `loss_mask` `(rows, seq_len)` of prompt + answer + eos.

    `loss_mask` marks the answer and eos tokens: the model learns to answer, not to predict the prompt.
    """
    if len(answers) != len(rows):
        raise ValueError(f"got {len(answers)} answers for {len(rows)} rows")
    sequences, answer_starts = [], []
    for row, answer in zip(rows, answers):
        prompt_ids = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True)
        if isinstance(prompt_ids, dict) or hasattr(prompt_ids, "input_ids"):
            prompt_ids = prompt_ids["input_ids"]
        answer_ids = tokenizer.encode(answer, add_special_tokens=False)
        sequences.append(list(prompt_ids) + answer_ids + [tokenizer.eos_token_id])
        answer_starts.append(len(prompt_ids))
    width = max(len(seq) for seq in sequences)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    loss_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (seq, start) in enumerate(zip(sequences, answer_starts)):
        input_ids[i, : len(seq)] = torch.tensor(seq)
        attention_mask[i, : len(seq)] = 1
        loss_mask[i, start : len(seq)] = 1
    return input_ids, attention_mask, loss_mask


def supervised_finetune(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    loss_mask: torch.Tensor,
    spec: WarmStartSpec,
    progress_every_s: float = 10.0,
    row_inputs: dict[str, torch.Tensor] | None = None,
) -> list[float]:
    """Trains `model` in place on the masked next-token loss; returns the loss of every step.

    Inputs are `(rows, seq_len)` from `sft_tensors`; each step takes `spec.batch_size` rows of a seeded
    permutation (reshuffled every epoch). `row_inputs`: more model inputs, one entry per row (a VLM's pixels),
    picked with the rows. Logs the step and loss every `progress_every_s` seconds (a first run on 2 loaded cores
    spends minutes here).
    """
    generator = torch.Generator().manual_seed(spec.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=spec.weight_decay)
    warmup = max(1, spec.steps // 10)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
    model.train()
    rows = input_ids.shape[0]
    order = torch.randperm(rows, generator=generator)
    cursor = 0
    losses = []
    last_report = time.perf_counter()
    for step in range(spec.steps):
        if cursor + spec.batch_size > rows:
            order, cursor = torch.randperm(rows, generator=generator), 0
        picked = order[cursor : cursor + spec.batch_size]
        cursor += spec.batch_size
        ids, mask, targets_mask = input_ids[picked], attention_mask[picked], loss_mask[picked]
        extra = {key: value[picked] for key, value in (row_inputs or {}).items()}
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False, **extra).logits[:, :-1]
        token_loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1), reduction="none"
        ).view_as(ids[:, 1:])
        weights = targets_mask[:, 1:].to(token_loss.dtype)
        loss = (token_loss * weights).sum() / weights.sum().clamp_min(1.0)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        if time.perf_counter() - last_report >= progress_every_s:
            logger.info("warm start: step %d/%d, loss %.3f", step + 1, spec.steps, losses[-1])
            last_report = time.perf_counter()
    model.eval()
    return losses


def _is_built(path: Path, spec: WarmStartSpec) -> bool:
    spec_file = path / _SPEC_FILE
    return spec_file.is_file() and json.loads(spec_file.read_text()).get("hash") == spec.spec_hash()


def warmstart_dir(cache_dir: str | os.PathLike, spec: WarmStartSpec = WarmStartSpec()) -> Path:
    """Where `build_warmstart_model` puts the checkpoint of `spec`."""
    return Path(cache_dir) / f"warmstart-{spec.task}-{spec.spec_hash()}"


def build_warmstart_model(cache_dir: str | os.PathLike, spec: WarmStartSpec = WarmStartSpec()) -> Path:
    """Builds (once) and returns the folder of the fine-tuned tiny model and its tokenizer, loadable by
    `AutoModelForCausalLM`/`AutoTokenizer` and vLLM. Concurrent callers each build and the first rename wins."""
    out_dir = warmstart_dir(cache_dir, spec)
    if _is_built(out_dir, spec):
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        start = time.perf_counter()
        logger.info(
            "warm start for task %r: fine-tuning the tiny model for %d supervised steps (once; cached in %s)",
            spec.task, spec.steps, out_dir,
        )
        base = build_tiny_model(staging / "base", spec.model)
        tokenizer = AutoTokenizer.from_pretrained(base)
        torch.manual_seed(spec.model.seed)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        rows = generate_split(spec.task, "sft", spec.sft_examples, spec.seed)
        answers = demonstrations(rows, spec.demo_accuracy, spec.seed)
        if get_task(spec.task).tokenizer == "tools":  # multi-turn demonstrations: correct ones call the tool
            from verl_like.models.tool_demos import tool_sft_tensors

            use_tool = [a == r["reward_model"]["ground_truth"] for a, r in zip(answers, rows)]
            input_ids, attention_mask, loss_mask = tool_sft_tensors(tokenizer, rows, use_tool)
        else:
            input_ids, attention_mask, loss_mask = sft_tensors(tokenizer, rows, answers)
        losses = supervised_finetune(model, input_ids, attention_mask, loss_mask, spec)
        final = staging / "model"
        model.to(getattr(torch, spec.model.torch_dtype)).save_pretrained(final, safe_serialization=True)
        for name in os.listdir(base):  # tokenizer and generation config travel unchanged
            if not (final / name).exists():
                shutil.copy2(base / name, final / name)
        (final / _SPEC_FILE).write_text(
            json.dumps({"hash": spec.spec_hash(), "final_loss": losses[-1], "spec": dataclasses.asdict(spec)},
                       indent=2)
        )
        try:
            os.rename(final, out_dir)
        except OSError:
            if not _is_built(out_dir, spec):
                raise
        logger.info(
            "warm start for task %r: %d supervised steps in %.1f s, loss %.3f -> %.3f, saved to %s",
            spec.task, spec.steps, time.perf_counter() - start, losses[0], losses[-1], out_dir,
        )
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir
