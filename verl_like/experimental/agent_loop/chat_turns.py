"""The ids a chat template inserts after a sampled assistant turn, and the start-up check of the template.

Token ids in, token ids out: the policy's turn is kept as sampled, and the messages that follow it (tool replies)
are appended as the template would render them. `TurnTemplate.append` renders a fixed conversation with and
without the new messages and takes the difference; that is only right when the template *extends its own
prefix* (rendering more messages never changes what came before). `check_template` renders a synthetic tool
conversation whole and turn by turn and reports where they differ (e.g. a template that drops earlier reasoning).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from verl_like.rollout.trajectory import LossMaskReason

_BASE = [{"role": "user", "content": "1"}, {"role": "assistant", "content": "2"}]


class TemplateError(ValueError):
    """The chat template cannot be extended turn by turn; the message names the template and the fix."""


def token_ids(rendered: Any) -> list[int]:
    """The ids of `apply_chat_template(..., tokenize=True)`: a list, or (transformers 5) a BatchEncoding."""
    if hasattr(rendered, "keys") and "input_ids" in rendered.keys():
        rendered = rendered["input_ids"]
    return [int(t) for t in rendered]


def render(tokenizer: Any, messages: Sequence[dict], add_generation_prompt: bool, **kwargs: Any) -> list[int]:
    """The template's ids of `messages`."""
    return token_ids(tokenizer.apply_chat_template(list(messages), add_generation_prompt=add_generation_prompt,
                                                   tokenize=True, **kwargs))


def _find(haystack: Sequence[int], needle: Sequence[int], start: int) -> int:
    if not needle:
        return -1
    for i in range(start, len(haystack) - len(needle) + 1):
        if list(haystack[i:i + len(needle)]) == list(needle):
            return i
    return -1


@dataclass
class Inserted:
    """Ids to append after an assistant turn and the reason of each (TOOL for message contents, else TEMPLATE)."""

    ids: list[int]
    reasons: list[int]


class TurnTemplate:
    """Appends messages after a sampled assistant turn that ended in the tokenizer's end-of-turn token."""

    def __init__(self, tokenizer: Any, name: str = "the tokenizer's chat template", **template_kwargs: Any) -> None:
        self.tokenizer = tokenizer
        self.name = name
        self.kwargs = template_kwargs
        self.base = render(tokenizer, _BASE, False, **template_kwargs)
        eos = tokenizer.eos_token_id
        ends = [i for i, token in enumerate(self.base) if token == eos]
        # What the template writes after the assistant's end token (Qwen: "\n"); the policy stops at the token.
        self.tail = self.base[ends[-1] + 1:] if ends else []

    def append(self, messages: Sequence[dict]) -> Inserted:
        """The ids (and reasons) of `messages` after an assistant turn, ending in the next generation prompt."""
        full = render(self.tokenizer, _BASE + list(messages), True, **self.kwargs)
        if full[:len(self.base)] != self.base:
            raise TemplateError(
                f"{self.name} does not extend its own prefix: rendering more messages changed the earlier ones. "
                "Multi-turn rollouts append each turn to the sampled ids; use a chat template that renders history "
                "unchanged (data.chat_template / actor_rollout_ref.model.custom_chat_template)")
        ids = self.tail + full[len(self.base):]
        reasons = [int(LossMaskReason.TEMPLATE)] * len(ids)
        cursor = len(self.tail)
        for message in messages:
            content = message.get("content")
            if not isinstance(content, str) or not content:
                continue
            content_ids = self.tokenizer.encode(content, add_special_tokens=False)
            at = _find(ids, content_ids, cursor)
            if at < 0:  # tokenised differently in context: call the whole insertion the tool's
                return Inserted(ids, [int(LossMaskReason.TOOL)] * len(ids))
            reasons[at:at + len(content_ids)] = [int(LossMaskReason.TOOL)] * len(content_ids)
            cursor = at + len(content_ids)
        return Inserted(ids, reasons)


def check_template(tokenizer: Any, name: str, mode: str = "strict", **template_kwargs: Any) -> str | None:
    """None when a tool conversation built turn by turn equals the template's rendering of it whole, else what
    differs (naming the template and the first differing token). mode: "ignore_strippable" forgives tokens that
    decode to whitespace only; "disable" skips the check."""
    if mode == "disable":
        return None
    # The call turn reasons first, in the layout reasoning templates render it, so that a template which drops
    # earlier turns' reasoning (e.g. before the last tool reply) is caught; to other templates it is plain text.
    call = '<think>\nr\n</think>\n\n<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    conversation = [{"role": "user", "content": "3"}, {"role": "assistant", "content": call},
                    {"role": "tool", "content": "4"}, {"role": "assistant", "content": "5"}]
    try:
        turns = TurnTemplate(tokenizer, name, **template_kwargs)
        built = render(tokenizer, conversation[:1], True, **template_kwargs)
        built += tokenizer.encode(call, add_special_tokens=False) + [tokenizer.eos_token_id]
        built += turns.append(conversation[2:3]).ids
        built += tokenizer.encode("5", add_special_tokens=False) + [tokenizer.eos_token_id]
        whole = render(tokenizer, conversation, False, **template_kwargs)
    except TemplateError as err:
        return str(err)
    except Exception as err:  # the template cannot render a tool turn at all
        return f"{name} cannot render a tool conversation ({type(err).__name__}: {err})"
    if len(whole) > len(built) and whole[:len(built)] == built:
        whole = whole[:len(built)]  # text after the last turn's end token (e.g. a newline) is never sampled
    if built == whole:
        return None
    if mode == "ignore_strippable":
        keep = lambda ids: [t for t in ids if tokenizer.decode([t]).strip()]  # noqa: E731
        if keep(built) == keep(whole):
            return None
    first = next((i for i, (a, b) in enumerate(zip(built, whole)) if a != b), min(len(built), len(whole)))
    return (f"{name} does not extend its own prefix: a tool conversation built turn by turn differs from the "
            f"template's rendering at token {first} ({tokenizer.decode(built[first:first + 8])!r} vs "
            f"{tokenizer.decode(whole[first:first + 8])!r}); multi-turn rollouts would train on ids the template "
            "would not produce. Use a template that renders history unchanged, or set "
            "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode=disable to accept it")
