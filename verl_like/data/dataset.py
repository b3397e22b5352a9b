"""RLDataset: prompt files -> chat-templated, length-checked prompt token ids; `collate` -> a left-padded DataProto.

Every row is read and checked when the dataset is built (verl_like/data/rows.py), so a bad row stops the job
before Ray starts, with its file, row index and field. Prompts longer than `data.max_prompt_length` tokens after
templating are handled by `data.overlong_prompt_policy`: "filter" drops them (the count is `num_filtered`, and
logged), "left" / "right" / "middle" cut tokens from that side / the middle, "error" raises naming the row.
With `data.return_raw_chat` the batch also carries each prompt's chat messages (column "raw_prompt", verl's);
nothing in verl_like needs them (prompt text is decoded from the token ids), they are for user code.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from verl_like.config.data import DataConfig
from verl_like.data.rows import DataRowError, PromptRow, load_rows
from verl_like.protocol import DataProto

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PromptItem:
    """One dataset item: the prompt's token ids (at most max_prompt_length) and what the reward needs."""

    input_ids: list[int]
    raw_prompt: list[dict[str, str]] | str
    ground_truth: Any
    data_source: str
    extra_info: dict[str, Any]
    index: int
    truncated: bool = False
    images: tuple = ()  # an image prompt's PIL images (data/vision.py)
    raw_prompt_ids: tuple[int, ...] = ()  # an image prompt's ids with one placeholder per image (input_ids: expanded)
    image_slots: int = 0  # pixel tiles its images take


def chat_messages(prompt: list[dict[str, str]] | str) -> list[dict[str, str]]:
    """The chat messages of a prompt: its message list, or a text prompt as one user message."""
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)


def _truncate(ids: list[int], limit: int, side: str) -> list[int]:
    if side == "left":
        return ids[-limit:]
    if side == "right":
        return ids[:limit]
    head = limit // 2  # middle: keep the start and the end of the prompt
    return ids[:head] + ids[len(ids) - (limit - head):]


class RLDataset:
    """The prompts of `files` (parquet or jsonl), templated and tokenized with `tokenizer`, per `config`.

    Reads `config.prompt_key`, `reward_fn_key`, `max_prompt_length`, `overlong_prompt_policy`, `chat_template`,
    `apply_chat_template`, `return_raw_chat` (other DataConfig fields belong to the loader and trainer). `dataset[i]` is a
    `PromptItem`; `dataset.collate(items)` builds the rollout input. `processor` (data/vision.py) is needed for rows
    with images; `model_path` names the model whose config picks the image family (default: the tokenizer's folder).
    """

    def __init__(
        self, files: Sequence[str], tokenizer: PreTrainedTokenizerBase, config: DataConfig, processor: Any = None,
        model_path: str | None = None,
    ) -> None:
        if isinstance(files, str):
            files = [files]
        self.files = [str(f) for f in files]
        self.tokenizer = tokenizer
        self.config = config
        self.max_prompt_length = config.max_prompt_length
        self.policy = config.overlong_prompt_policy
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer has no pad token; set tokenizer.pad_token (e.g. to its eos token)")
        has_template = config.chat_template is not None or getattr(tokenizer, "chat_template", None)
        if config.apply_chat_template and not has_template:
            raise ValueError(
                "data.apply_chat_template=true but the tokenizer has no chat template; set data.chat_template to a "
                "Jinja template, or data.apply_chat_template=false to tokenize text prompts as they are"
            )
        rows = load_rows(self.files, config.prompt_key, config.reward_fn_key, config.image_key, config.video_key)
        self.vision = None  # VisionPrompts when some row has images (data/vision.py)
        first_image_row = next((row for row in rows if row.images), None)
        if first_image_row is not None:
            if processor is None:
                raise DataRowError(
                    f"{first_image_row.file} row {first_image_row.row_index}: field {config.image_key!r} holds images "
                    "but the model has no image processor (no preprocessor_config.json beside its tokenizer); use a "
                    "vision-language model, or drop the images"
                )
            from verl_like.data.vision import refuse_text_rows, vision_prompts

            refuse_text_rows(rows, config.image_key)
            self.vision = vision_prompts(processor, model_path or tokenizer.name_or_path)
        self.items: list[PromptItem] = []
        self.num_filtered = 0
        self.num_truncated = 0
        longest = 0
        for row in rows:
            item = self._tokenize(row, len(self.items))
            longest = max(longest, len(item.input_ids))
            if len(item.input_ids) > self.max_prompt_length:
                if self.policy == "filter":
                    self.num_filtered += 1
                    continue
                item = self._cut(item, row)
            self.items.append(item)
        if self.num_filtered:
            logger.warning(
                "%s: filtered %d of %d prompts longer than data.max_prompt_length=%d tokens (longest %d); "
                "raise max_prompt_length to keep them", ", ".join(self.files), self.num_filtered, len(rows),
                self.max_prompt_length, longest,
            )
        if self.num_truncated:
            logger.warning("%s: truncated %d prompts (%s) to data.max_prompt_length=%d tokens",
                           ", ".join(self.files), self.num_truncated, self.policy, self.max_prompt_length)
        if not self.items:
            raise ValueError(
                f"{', '.join(self.files)}: all {len(rows)} prompts are longer than data.max_prompt_length="
                f"{self.max_prompt_length} tokens (longest {longest}) and were filtered; raise max_prompt_length"
            )

    def _template(self, row: PromptRow) -> str:
        where = f"{row.file} row {row.row_index}"
        if not self.config.apply_chat_template:
            if not isinstance(row.prompt, str):
                raise DataRowError(
                    f"{where}: field {self.config.prompt_key!r} holds chat messages but data.apply_chat_template=false;"
                    " set it true, or store the prompt as text"
                )
            return row.prompt
        messages = chat_messages(row.prompt)
        try:
            return self.tokenizer.apply_chat_template(
                messages, chat_template=self.config.chat_template, add_generation_prompt=True, tokenize=False
            )
        except Exception as error:  # jinja raises TemplateError and others from raise_exception()
            raise DataRowError(
                f"{where}: the chat template rejected field {self.config.prompt_key!r} ({error}); fix the messages or "
                "set data.chat_template"
            ) from error

    def _tokenize(self, row: PromptRow, index: int) -> PromptItem:
        text = self._template(row)
        if self.vision is not None:
            text = self.vision.mark_images(text)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if not ids:
            raise DataRowError(
                f"{row.file} row {row.row_index}: field {self.config.prompt_key!r} tokenizes to no tokens; the "
                "tokenizer cannot encode its characters"
            )
        if self.vision is not None:
            try:
                expanded, slots = self.vision.expand(ids, row.images, f"{row.file} row {row.row_index}")
            except ValueError as error:
                raise DataRowError(str(error)) from error
            if row.images:
                return PromptItem(expanded, row.prompt, row.ground_truth, row.data_source, row.extra_info, index,
                                  images=row.images, raw_prompt_ids=tuple(ids), image_slots=slots)
        return PromptItem(list(ids), row.prompt, row.ground_truth, row.data_source, row.extra_info, index)

    def _cut(self, item: PromptItem, row: PromptRow) -> PromptItem:
        if self.policy == "error":
            raise DataRowError(
                f"{row.file} row {row.row_index}: field {self.config.prompt_key!r} is {len(item.input_ids)} tokens "
                f"after the chat template, over data.max_prompt_length={self.max_prompt_length}; raise max_prompt_length, "
                "or set data.truncation to filter/left/right/middle"
            )
        if item.images:
            raise DataRowError(
                f"{row.file} row {row.row_index}: the image prompt is {len(item.input_ids)} tokens with its image "
                f"tokens, over data.max_prompt_length={self.max_prompt_length}; cutting it would cut image tokens, so "
                "raise max_prompt_length or set data.truncation=filter"
            )
        self.num_truncated += 1
        ids = _truncate(item.input_ids, self.max_prompt_length, self.policy)
        return PromptItem(ids, item.raw_prompt, item.ground_truth, item.data_source, item.extra_info, item.index,
                          truncated=True)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> PromptItem:
        return self.items[index]

    def collate(self, items: Sequence[PromptItem]) -> DataProto:
        """The rollout input of `items` (see `collate`) padded to this dataset's max_prompt_length, with
        "raw_prompt" when data.return_raw_chat; for a dataset with images also the pixels of each prompt (computed
        here, once per prompt) and the vLLM columns (data/vision.py)."""
        batch = collate(
            items, self.max_prompt_length, int(self.tokenizer.pad_token_id), return_raw_chat=self.config.return_raw_chat
        )
        if self.vision is None:
            return batch
        from verl_like.data.vision import MULTI_MODAL_DATA, RAW_PROMPT_IDS, object_column

        tensors = self.vision.pixel_tensors([item.images for item in items], self.image_slots)
        tensors.update(self.vision.position_tensors(batch.batch["input_ids"], batch.batch["attention_mask"], tensors))
        for key, value in tensors.items():
            batch.batch[key] = value
        batch.non_tensor_batch[MULTI_MODAL_DATA] = object_column(
            [{"image": list(item.images)} if item.images else None for item in items])
        batch.non_tensor_batch[RAW_PROMPT_IDS] = object_column(
            [list(item.raw_prompt_ids) if item.images else list(item.input_ids) for item in items])
        return batch

    @property
    def image_slots(self) -> int:
        """Pixel slots of every batch: the most any prompt of the dataset takes (batches of one dataset share a
        shape, so they concatenate)."""
        if not hasattr(self, "_image_slots"):
            self._image_slots = max(item.image_slots for item in self.items)
        return self._image_slots


def collate(
    items: Sequence[PromptItem], max_prompt_length: int, pad_token_id: int, return_raw_chat: bool = False
) -> DataProto:
    """A DataProto of `items`: `input_ids`, `attention_mask`, `position_ids` `(batch, max_prompt_length)`,
    left-padded with `pad_token_id`, positions counting 0, 1, ... from each prompt's first token; non-tensor
    columns ground_truth, data_source, extra_info, index and a fresh uid per row, and with `return_raw_chat`
    raw_prompt: each prompt's chat messages, a list of {"role", "content"} (a text prompt as one user message)."""
    if not items:
        raise ValueError("collate got no items; a batch needs at least one prompt")
    rows = len(items)
    input_ids = torch.full((rows, max_prompt_length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((rows, max_prompt_length), dtype=torch.long)
    for i, item in enumerate(items):
        length = len(item.input_ids)
        if length > max_prompt_length:
            raise ValueError(f"item {item.index} has {length} tokens, over max_prompt_length={max_prompt_length}")
        input_ids[i, max_prompt_length - length:] = torch.tensor(item.input_ids, dtype=torch.long)
        attention_mask[i, max_prompt_length - length:] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)

    def column(values: list) -> np.ndarray:
        array = np.empty(rows, dtype=object)
        for i, value in enumerate(values):
            array[i] = value
        return array

    non_tensors = {
        "ground_truth": column([item.ground_truth for item in items]),
        "data_source": column([item.data_source for item in items]),
        "extra_info": column([item.extra_info for item in items]),
        "index": np.array([item.index for item in items], dtype=np.int64),
        "uid": column([uuid.uuid4().hex for _ in items]),
    }
    if return_raw_chat:
        non_tensors["raw_prompt"] = column([chat_messages(item.raw_prompt) for item in items])
    return DataProto.from_dict(
        tensors={"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids},
        non_tensors=non_tensors,
    )
