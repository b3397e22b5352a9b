"""Tool-call parsing of an assistant turn. `hermes` (Qwen's and Hermes' format): `<tool_call>{json}</tool_call>`.

A call that cannot be read (not JSON, not an object with a string "name" and object "arguments", or an opening
tag never closed) is *malformed*: the agent loop answers it with an error message as the tool's reply and
counts it in agent/malformed_calls, so the policy learns the format instead of being silently ignored.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from verl_like.tools.schemas import OpenAIFunctionCallSchema


@dataclass
class FunctionCall:
    """verl's parsed call: the function's `name` and its `arguments` as a JSON string."""

    name: str
    arguments: str


@dataclass
class ParsedTurn:
    """An assistant turn read for tool calls: its text outside the calls, the calls, and why others failed."""

    content: str
    calls: list[OpenAIFunctionCallSchema] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)


class ToolParser:
    """Base class; `get_tool_parser(name, tokenizer)` returns the registered parser for a `multi_turn.format`."""

    _registry: dict[str, type[ToolParser]] = {}

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def register(cls, name: str):
        def decorator(subclass: type[ToolParser]) -> type[ToolParser]:
            cls._registry[name] = subclass
            return subclass
        return decorator

    @classmethod
    def get_tool_parser(cls, name: str, tokenizer: Any) -> ToolParser:
        if name not in cls._registry:
            raise ValueError(f"actor_rollout_ref.rollout.multi_turn.format={name!r} has no tool parser; "
                             f"known: {sorted(cls._registry)}")
        return cls._registry[name](tokenizer)

    def parse(self, text: str) -> ParsedTurn:
        raise NotImplementedError

    async def extract_tool_calls(self, responses_ids: list[int]) -> tuple[str, list[FunctionCall]]:
        """verl's call: (content, calls) of a turn's ids; malformed calls are dropped here (see `parse`)."""
        parsed = self.parse(self.tokenizer.decode(responses_ids, skip_special_tokens=False))
        return parsed.content, [FunctionCall(c.name, json.dumps(c.arguments)) for c in parsed.calls]


def _call_from_json(body: str) -> tuple[OpenAIFunctionCallSchema | None, str | None]:
    try:
        value = json.loads(body)
    except json.JSONDecodeError as err:
        return None, f"not valid JSON ({err.msg} at char {err.pos})"
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None, 'expected an object {"name": ..., "arguments": {...}}'
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None, "arguments is a string that is not JSON"
    if not isinstance(arguments, dict):
        return None, "arguments must be an object"
    return OpenAIFunctionCallSchema(name=value["name"], arguments=arguments), None


@ToolParser.register("hermes")
class HermesToolParser(ToolParser):
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number per turn."""

    open_tag, close_tag = "<tool_call>", "</tool_call>"

    def parse(self, text: str) -> ParsedTurn:
        pattern = re.compile(re.escape(self.open_tag) + r"(.*?)" + re.escape(self.close_tag), re.DOTALL)
        parsed = ParsedTurn(content=pattern.sub("", text).strip())
        for match in pattern.finditer(text):
            call, error = _call_from_json(match.group(1).strip())
            if call is not None:
                parsed.calls.append(call)
            else:
                parsed.malformed.append(error)
        rest = pattern.sub("", text)
        if self.open_tag in rest:
            parsed.malformed.append(f"{self.open_tag} without a closing {self.close_tag}")
            parsed.content = rest.split(self.open_tag)[0].strip()
        return parsed
