"""Tool schemas in OpenAI's function format and a tool's response (verl's `verl.tools.schemas` names)."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, Field


class OpenAIFunctionPropertySchema(BaseModel):
    """One parameter of a function: its JSON type, description and allowed values."""

    type: str
    description: str | None = None
    enum: list[str] | None = None
    items: dict[str, Any] | None = None


class OpenAIFunctionParametersSchema(BaseModel):
    """A function's parameters: an object with named properties, some required."""

    type: str = "object"
    properties: dict[str, OpenAIFunctionPropertySchema] = Field(default_factory=dict)
    required: list[str] = Field(default_factory=list)


class OpenAIFunctionSchema(BaseModel):
    """A function the model may call."""

    name: str
    description: str = ""
    parameters: OpenAIFunctionParametersSchema = Field(default_factory=OpenAIFunctionParametersSchema)
    strict: bool = False


class OpenAIFunctionToolSchema(BaseModel):
    """A tool in OpenAI's format: `{"type": "function", "function": {...}}` (what chat templates render)."""

    type: str = "function"
    function: OpenAIFunctionSchema


class OpenAIFunctionCallSchema(BaseModel):
    """A parsed call: the function's name and its arguments."""

    name: str
    arguments: dict[str, Any]


class OpenAIFunctionToolCall(BaseModel):
    """A tool call with its id, as a chat message's `tool_calls` entry holds it."""

    id: str
    type: Literal["function"] = "function"
    function: OpenAIFunctionCallSchema


class ToolResponse(BaseModel):
    """What a tool returns to the model: text (images and videos are carried for multimodal tools)."""

    text: str | None = None
    image: list[Any] | None = None
    video: list[Any] | None = None

    def is_empty(self) -> bool:
        return not self.text and not self.image and not self.video


def schema_dict(schema: OpenAIFunctionToolSchema) -> dict[str, Any]:
    """The schema as the plain dict `apply_chat_template(tools=...)` takes."""
    return json.loads(schema.model_dump_json(exclude_none=True))
