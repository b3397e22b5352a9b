"""`BaseTool`: a stateful tool with verl's lifecycle (create, execute, calc_reward, release) per trajectory.

    class Counter(BaseTool):
        async def create(self, instance_id=None, **kwargs):
            instance_id, response = await super().create(instance_id)
            self.counts[instance_id] = 0
            return instance_id, response
        async def execute(self, instance_id, parameters, **kwargs):
            self.counts[instance_id] += 1
            return ToolResponse(text=str(self.counts[instance_id])), 0.0, {}

`create` is called once per trajectory before the tool's first call (with the sample's `tools_kwargs` for this
tool as keywords), `release` after the trajectory ends, also when it failed. `execute` returns
(response, step reward, metrics); a metrics entry `"error": True` counts the call in `agent/tool_errors` (the
model asked for something the tool refuses: bad arguments, no result); an exception, a hang past
`multi_turn.tool_timeout_s` or a crashed backend marks the sample as an infrastructure failure instead.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from verl_like.tools.schemas import OpenAIFunctionToolSchema, ToolResponse


class BaseTool:
    """A tool named by `tool_schema.function.name`; `config` is its entry's `config` in the tool config file."""

    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | None) -> None:
        self.config = dict(config or {})
        self.tool_schema = tool_schema or self.get_openai_tool_schema()
        if self.tool_schema is None:
            raise ValueError(f"{type(self).__name__}: no tool_schema given and get_openai_tool_schema() has none")
        self.name = self.tool_schema.function.name

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema | None:
        """The schema the chat template renders for the model (override when not given in the config)."""
        return getattr(self, "tool_schema", None)

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        """Starts this tool's state for one trajectory; returns its instance id and a (usually empty) response."""
        return (instance_id or uuid4().hex), ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
                      ) -> tuple[ToolResponse, float, dict[str, Any]]:
        """Runs one call; returns (response, step reward, metrics)."""
        return ToolResponse(text="ok"), 0.0, {}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """A reward from the tool's state at the end of the trajectory (added to its turn rewards)."""
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Frees the trajectory's state."""
