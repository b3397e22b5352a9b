"""Each training step's generations on disk (`trainer.rollout_data_dir`, verl's key of the same name).

With the key set, training step s (1-based, the step of metrics.jsonl) writes <rollout_data_dir>/<s>.jsonl, one JSON
record per sample the step trains on, once its batch is generated and scored (after DAPO's group filter, before
the update; the synchronous loop, the asynchronous driver and online DPO all pass there):
  step            s
  index           the prompt's row in the training dataset (the batch's "index" column)
  uid             the prompt's group id (its rollout.n samples share it)
  input, output   prompt and response text (valid tokens, special tokens skipped)
  score           the sequence score the step trains on: token_level_scores summed (rule and/or reward model,
                  overlong penalty included)
  weight_version  the policy version (actor updates synced into the rollout) that generated the sample: the
                  current one on the synchronous path, up to async_training.staleness behind it on the async one
  data_source, ground_truth   when the batch has them
  agent_num_turns, turn_versions   multi-turn samples: chat turns, and the weight version of each assistant turn
                  (with partial rollout a sample's later turns may come from newer weights than weight_version)
A file is written under a temporary name and renamed into place (os.replace), so a killed run leaves whole files
only. A run killed during step s may leave s.jsonl although step s never finished; the resumed run rewrites it.
A run killed during a write leaves its hidden temporary file (.s.jsonl.<pid>.tmp); the next run on the directory
removes such files before its first step (`remove_stale_temp_files`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from verl_like.protocol import DataProto
from verl_like.rollout.trajectory import infra_failed_rows
from verl_like.trainer.val_generations import decode_samples
from verl_like.utils.checkpoint import write_text_atomically

OPTIONAL_COLUMNS = ("data_source", "ground_truth", "agent_num_turns")


def rollout_records(batch: DataProto, tokenizer: Any, step: int, weight_version: int | None) -> list[dict[str, Any]]:
    """One record per row of a scored rollout batch (module doc); weight_version None leaves the field out.

    Reads `input_ids`, `attention_mask`, `responses`, `response_mask`, `token_level_scores` `(batch, response_len)`
    and the non-tensor columns index, uid, data_source and ground_truth.
    """
    scores = batch.batch["token_level_scores"].sum(-1)
    samples = decode_samples(batch, scores, tokenizer, len(batch), skip_special_tokens=True)
    columns = batch.non_tensor_batch
    failed = infra_failed_rows(batch).tolist()
    records = []
    for row, sample in enumerate(samples):
        record: dict[str, Any] = {
            "step": step,
            "index": int(columns["index"][row]) if "index" in columns else None,
            "uid": str(columns["uid"][row]) if "uid" in columns else None,
            "input": sample.prompt,
            "output": sample.response,
            "score": sample.score,
        }
        if weight_version is not None:
            record["weight_version"] = int(weight_version)
        if "loss_mask_reason" in batch.batch.keys():  # a multi-turn trajectory: what the loss trained on
            record["trained_tokens"] = int(batch.batch["response_mask"][row].sum())
            record["infra_failure"] = bool(failed[row])
        if "agent_turn_versions" in columns:
            record["turn_versions"] = [int(v) for v in columns["agent_turn_versions"][row]]
        for key in OPTIONAL_COLUMNS:
            if key in columns and columns[key][row] is not None:
                record[key] = columns[key][row]
        records.append(record)
    return records


def _plain(value: Any) -> Any:
    """numpy values (parquet hands lists over as arrays) as JSON-able Python values; anything else as text."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


def write_records(path: Path, records: list[dict[str, Any]]) -> None:
    """Writes `records` to `path` as JSON lines, atomically: a reader (or a kill) never sees half a file."""
    write_text_atomically(path, "".join(json.dumps(r, ensure_ascii=False, default=_plain) + "\n" for r in records))


def remove_stale_temp_files(directory: Path) -> list[Path]:
    """Removes the hidden temporary files of writes a killed run left in `directory` (no writer of this run is
    active when it is called: before the first step); returns what it removed."""
    directory = Path(directory)
    stale = sorted(directory.glob(".*.jsonl.*.tmp")) if directory.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def dump_rollouts(
    directory: Path, batch: DataProto, tokenizer: Any, step: int, weight_version: int | None
) -> Path:
    """Writes the records of `batch` to <directory>/<step>.jsonl (replacing an earlier one); returns its path."""
    path = Path(directory) / f"{step}.jsonl"
    write_records(path, rollout_records(batch, tokenizer, step, weight_version))
    return path
