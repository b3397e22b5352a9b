"""Reads parquet / jsonl prompt files and checks every row, with errors that name the file, row, field and fix.

A row, as verl users have them::

    {"data_source": "openai/gsm8k",
     "prompt": [{"role": "user", "content": "..."}]        # or plain text
     "reward_model": {"style": "rule", "ground_truth": "72"},  # or a top-level "ground_truth"
     "extra_info": {"split": "train", "index": 0}}           # optional
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_like.config.data import SUPPORTED_SUFFIXES

logger = logging.getLogger(__name__)

CHAT_ROLES = ("system", "user", "assistant", "tool")


class DataRowError(ValueError):
    """A data file or row that cannot be used; the message names the file, row, field and the fix."""


@dataclass(frozen=True)
class PromptRow:
    """One checked row: `prompt` is a list of {role, content} messages or a text string."""

    prompt: list[dict[str, str]] | str
    ground_truth: Any
    data_source: str
    extra_info: dict[str, Any] = field(default_factory=dict)
    file: str = ""
    row_index: int = 0
    images: tuple = ()  # PIL images of an image prompt (data/vision.py), in placeholder order


def _where(file: str, row_index: int) -> str:
    return f"{file} row {row_index}"


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of one parquet or jsonl file as plain dicts (nested values as lists and dicts)."""
    path = Path(path)
    if path.suffix not in SUPPORTED_SUFFIXES:
        raise DataRowError(
            f"{path}: unsupported file type {path.suffix!r}; use {' or '.join(SUPPORTED_SUFFIXES)} "
            "(examples/data_preprocess/ converts GSM8K and MATH files)"
        )
    if not path.is_file():
        raise DataRowError(f"{path}: no such file; check data.train_files / data.val_files")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            records = pq.read_table(path).to_pylist()
        except Exception as error:  # pyarrow raises several types for corrupt files
            raise DataRowError(
                f"{path}: not a readable parquet file ({error}); rewrite it with pyarrow or pandas"
            ) from error
    else:
        records = []
        with path.open(encoding="utf-8") as handle:
            for line_number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise DataRowError(
                        f"{path} line {line_number}: not valid JSON ({error.msg} at column {error.colno}); "
                        "each line of a .jsonl file must be one JSON object"
                    ) from error
                if not isinstance(record, dict):
                    raise DataRowError(
                        f"{path} line {line_number}: a JSON {type(record).__name__}, not an object; each line must be "
                        '{"prompt": ..., "reward_model": {"ground_truth": ...}, "data_source": ...}'
                    )
                records.append(record)
    if not records:
        raise DataRowError(f"{path}: holds no rows; remove it from the data files or regenerate it")
    return records


def _check_prompt(value: Any, where: str, prompt_key: str) -> list[dict[str, str]] | str:
    if isinstance(value, str):
        if not value.strip():
            raise DataRowError(f"{where}: field {prompt_key!r} is an empty string; give the prompt text")
        return value
    if not isinstance(value, (list, tuple)):
        raise DataRowError(
            f"{where}: field {prompt_key!r} is a {type(value).__name__}; it must be a list of chat messages "
            '[{"role": "user", "content": "..."}] or a text string'
        )
    if not value:
        raise DataRowError(f"{where}: field {prompt_key!r} is an empty list; give at least one chat message")
    messages = []
    for i, message in enumerate(value):
        name = f"{prompt_key}[{i}]"
        if not isinstance(message, dict):
            raise DataRowError(
                f"{where}: field {name!r} is a {type(message).__name__}; each message must be an object "
                '{"role": ..., "content": ...}'
            )
        for key in ("role", "content"):
            if key not in message or message[key] is None:
                raise DataRowError(
                    f"{where}: field {name + '.' + key!r} is missing; each message needs role and content"
                )
        role, content = message["role"], message["content"]
        if role not in CHAT_ROLES:
            raise DataRowError(f"{where}: field {name + '.role'!r} is {role!r}; use one of {CHAT_ROLES}")
        if isinstance(content, (list, tuple)):  # content parts: text and image parts (data/vision.py)
            from verl_like.data.vision import content_text

            try:
                content = content_text(content, f"{where}: field {name + '.content'!r}")
            except ValueError as error:
                raise DataRowError(str(error)) from error
        if not isinstance(content, str):
            raise DataRowError(
                f"{where}: field {name + '.content'!r} is a {type(content).__name__}; message content must be text"
            )
        messages.append({"role": role, "content": content})
    return messages


def _ground_truth(record: dict[str, Any], where: str) -> Any:
    reward_model = record.get("reward_model")
    if reward_model is not None:
        if not isinstance(reward_model, dict):
            raise DataRowError(
                f"{where}: field 'reward_model' is a {type(reward_model).__name__}; it must be an object "
                '{"style": "rule", "ground_truth": ...}'
            )
        if reward_model.get("ground_truth") is not None:
            return reward_model["ground_truth"]
    if record.get("ground_truth") is not None:
        return record["ground_truth"]
    raise DataRowError(
        f"{where}: field 'reward_model.ground_truth' is missing or null (and there is no top-level 'ground_truth'); "
        "add the reference answer the reward function compares against"
    )


def check_record(
    record: dict[str, Any], file: str, row_index: int, prompt_key: str = "prompt", reward_fn_key: str = "data_source",
    image_key: str = "images", video_key: str = "videos",
) -> PromptRow:
    """The checked `PromptRow` of one raw record; raises DataRowError naming the file, row and field."""
    where = _where(file, row_index)
    if record.get(video_key) not in (None, [], ()):
        raise DataRowError(f"{where}: field {video_key!r} holds videos; video prompts are not supported (images "
                           "only, docs/vision.md); drop the column or the row")
    if prompt_key not in record or record[prompt_key] is None:
        raise DataRowError(
            f"{where}: field {prompt_key!r} is missing; columns present: {sorted(record)}; set data.prompt_key to the "
            "column holding the prompt"
        )
    prompt = _check_prompt(record[prompt_key], where, prompt_key)
    ground_truth = _ground_truth(record, where)
    data_source = record.get(reward_fn_key)
    if not isinstance(data_source, str) or not data_source:
        raise DataRowError(
            f"{where}: field {reward_fn_key!r} is {data_source!r}; it must name the task (e.g. 'openai/gsm8k') so the "
            f"reward registry can pick its scorer; add the column or set data.reward_fn_key"
        )
    extra_info = record.get("extra_info")
    if extra_info is None:
        extra_info = {}
    if not isinstance(extra_info, dict):
        raise DataRowError(
            f"{where}: field 'extra_info' is a {type(extra_info).__name__}; it must be an object or null"
        )
    images = ()
    if record.get(image_key) is not None:
        from verl_like.data.vision import row_images

        try:
            images = row_images(record, image_key, where, Path(file).parent)
        except ValueError as error:
            raise DataRowError(str(error)) from error
    return PromptRow(prompt, ground_truth, data_source, dict(extra_info), file, row_index, images)


def load_rows(
    files: list[str] | tuple[str, ...], prompt_key: str = "prompt", reward_fn_key: str = "data_source",
    image_key: str = "images", video_key: str = "videos",
) -> list[PromptRow]:
    """Every row of `files`, in order, checked (with its images, when it has any under `image_key`)."""
    rows: list[PromptRow] = []
    for file in files:
        records = read_records(file)
        rows.extend(check_record(record, str(file), i, prompt_key, reward_fn_key, image_key, video_key)
                    for i, record in enumerate(records))
    return rows
