"""Logging a few validation samples (prompt, response, score) per validation (`trainer.log_val_generations`).

The samples are the first N rows of the validation set, which is never shuffled, so every validation shows the
same prompts and a reader sees how the answers change. They go where `trainer.logger` sends metrics:
  console      one log line per sample;
  jsonl        <run dir>/val_generations.jsonl, one record per validation: {"step": s, "samples": [...]};
  tensorboard  a markdown table under the text tag "val/generations" (TensorBoard's TEXT tab).
W&B and MLflow receive only the metrics, not the samples.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from verl_like.protocol import DataProto

logger = logging.getLogger(__name__)

TEXT_TAG = "val/generations"


@dataclass(frozen=True)
class ValSample:
    prompt: str
    response: str
    score: float


def decode_samples(
    batch: DataProto, scores: torch.Tensor, tokenizer: Any, limit: int, skip_special_tokens: bool = False
) -> list[ValSample]:
    """The first `limit` rows of a rollout batch as text: prompt (valid tokens), response (every token the
    attention mask covers: a multi-turn trajectory's tool replies too), score.

    scores: `(batch,)` sequence scores. skip_special_tokens: drop the tokenizer's special tokens (eos, chat markers)
    from the text; kept by default, so the validation log shows what the model emitted.
    """
    tensors = batch.batch
    response_len = tensors["responses"].shape[1]
    prompt_mask = tensors["attention_mask"][:, :-response_len].bool()
    response_mask = tensors["attention_mask"][:, -response_len:].bool()
    samples = []
    for row in range(min(limit, len(batch))):
        prompt_ids = tensors["input_ids"][row, :-response_len][prompt_mask[row]].tolist()
        response_ids = tensors["responses"][row][response_mask[row]].tolist()
        samples.append(ValSample(
            prompt=tokenizer.decode(prompt_ids, skip_special_tokens=skip_special_tokens),
            response=tokenizer.decode(response_ids, skip_special_tokens=skip_special_tokens),
            score=float(scores[row]),
        ))
    return samples


def _markdown(samples: list[ValSample]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    rows = [f"| {cell(s.prompt)} | {cell(s.response)} | {s.score:.4g} |" for s in samples]
    return "\n".join(["| prompt | response | score |", "|---|---|---|", *rows])


class ValGenerationLogger:
    """Writes the validation samples of each validation to the backends named in `backends` (trainer.logger)."""

    def __init__(self, backends: tuple[str, ...] | list[str], run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.jsonl_path = self.run_dir / "val_generations.jsonl"
        self._console = "console" in backends
        self._jsonl = "jsonl" in backends
        self._writer = None
        if "tensorboard" in backends:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))

    def log(self, samples: list[ValSample], step: int) -> None:
        if not samples:
            return
        if self._console:
            for number, sample in enumerate(samples):
                logger.info("val sample %d at step %d: score=%.4g prompt=%r response=%r",
                            number, step, sample.score, sample.prompt, sample.response)
        if self._jsonl:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            with self.jsonl_path.open("a", encoding="utf-8") as file:
                file.write(json.dumps({"step": step, "samples": [asdict(s) for s in samples]}) + "\n")
        if self._writer is not None:
            self._writer.add_text(TEXT_TAG, _markdown(samples), step)
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
