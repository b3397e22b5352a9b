"""Image prompts through agent loops: what each turn sends the engine, and the expansion it reads back.

A loop passes its sample's images as `image_data` (verl's `AgentLoopBase` name; the dataset's
`multi_modal_data["image"]`, see `loop_image_data`) with every turn's `prompt_ids`. The engine expands each image
placeholder itself, and a prompt that is already expanded would be expanded again, so every turn is sent with the
expansion collapsed back to one placeholder per image (`ImageTurns.engine_ids`); the engine's expanded prompt comes
back (`TokenOutput.prompt_ids`) and must equal the turn's prompt, or the trainer would score another sequence than
the one sampled (`ImageTurns.check`).

Two ways a trajectory starts, both exact:
- from the dataset's expanded prompt (`prompt_ids`, what single_turn_agent sends): its unexpanded form is the
  row's `raw_prompt_ids`;
- from a prompt with one placeholder per image (a loop's own chat template, as tool_agent renders it): sent as
  it is; the engine's expansion becomes the trajectory's prompt (the loop keeps `TokenOutput.prompt_ids`).
Later turns start with one of these expanded prompts followed by the turns' tokens, and are collapsed by swapping
that prefix for its unexpanded form. The trainer reads the batch's `pixel_values` (the dataset's, one set per
prompt, repeated over its n samples by `build_trajectory_batch`): the images are processed once per prompt there,
and the engine processes them once per turn.

Not supported: images that a tool adds mid-trajectory (a turn whose prompt does not start with a known prefix and
holds more placeholders than the sample's images raises, naming the sample).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from verl_like.data.vision import MULTI_MODAL_DATA, RAW_PROMPT_IDS


def loop_image_data(kwargs: dict[str, Any]) -> list[Any] | None:
    """The sample's images (verl's `image_data`) from a loop's dataset columns, None for a text sample."""
    data = kwargs.get(MULTI_MODAL_DATA) or {}
    images = list(data.get("image", ()) or ())
    return images or None


class ImageTurns:
    """One sample's known (unexpanded, expanded) prompt pairs; `image_token_id`: the placeholder."""

    def __init__(self, image_token_id: int, where: str) -> None:
        self.image_token_id = image_token_id
        self.where = where
        self.pairs: list[tuple[list[int], list[int]]] = []

    @classmethod
    def of_row(cls, row: dict[str, Any], image_token_id: int | None, where: str) -> ImageTurns | None:
        """The sample's turns for a runner's row (its dataset columns), seeded with the dataset's pair; None for a
        row without images or an engine without a placeholder."""
        if image_token_id is None or loop_image_data(row) is None:
            return None
        turns = cls(image_token_id, where)
        raw, expanded = row.get(RAW_PROMPT_IDS), row.get("prompt_ids")
        if raw is not None and expanded is not None:
            turns.pairs.append(([int(t) for t in raw], [int(t) for t in expanded]))
        return turns

    def engine_ids(self, prompt_ids: Sequence[int], images: Sequence[Any]) -> tuple[list[int], bool]:
        """(the ids to send for a turn's `prompt_ids`, whether they are a new unexpanded prompt whose expansion
        is to be learnt); ValueError naming the sample when the placeholders do not match the images."""
        ids = [int(t) for t in prompt_ids]
        for raw, expanded in self.pairs:
            if ids[:len(expanded)] == expanded:
                collapsed = raw + ids[len(expanded):]
                self._check_count(collapsed, images)
                return collapsed, False
        self._check_count(ids, images)
        return ids, True

    def _check_count(self, ids: list[int], images: Sequence[Any]) -> None:
        count = sum(t == self.image_token_id for t in ids)
        if count != len(images):
            raise ValueError(
                f"{self.where}: the turn's prompt holds {count} image placeholder(s) for {len(images)} image(s); a "
                "turn's prompt must begin with the sample's prompt (expanded or with one placeholder per image) and "
                "add no placeholder (images from tools are not supported)")

    def check(self, prompt_ids: Sequence[int], sent: list[int], engine_prompt: list[int] | None, new: bool) -> None:
        """Raises ValueError naming the sample when the engine's expanded prompt is not the turn's (a collapsed
        turn); records the expansion of a new unexpanded prompt."""
        if engine_prompt is None:
            raise ValueError(f"{self.where}: the engine did not report the expanded prompt of an image turn")
        if new:
            self.pairs.append((sent, list(engine_prompt)))
        elif list(engine_prompt) != [int(t) for t in prompt_ids]:
            raise ValueError(
                f"{self.where}: the engine expanded the image prompt to {len(engine_prompt)} tokens but the turn's "
                f"prompt holds {len(prompt_ids)}; the processor beside the tokenizer and the engine's disagree on "
                "the image tokens (the trainer would score another sequence than the one sampled)")
