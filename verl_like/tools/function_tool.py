"""`@function_tool`: a plain function as a tool, its JSON schema read from the type hints and the docstring.

    @function_tool
    def calculator(expression: str) -> str:
        \"\"\"Evaluates an arithmetic expression exactly.

        Args:
            expression: numbers with + - * / and parentheses, e.g. "347*29".
        \"\"\"
        ...

The function may be sync (run in a worker thread, so a slow one does not stall generation) or async. It returns
the text the model reads (anything else is turned into text with str()). Raising `ToolInputError` means the
model's call was bad (counted in agent/tool_errors, the message goes back to the model); any other exception is an
infrastructure failure of the sample. The decorated object is a `BaseTool` and stays callable as the function.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import threading
import typing
from typing import Any, Callable

from verl_like.tools.base_tool import BaseTool
from verl_like.tools.schemas import (
    OpenAIFunctionParametersSchema,
    OpenAIFunctionPropertySchema,
    OpenAIFunctionSchema,
    OpenAIFunctionToolSchema,
    ToolResponse,
)

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


class ToolInputError(ValueError):
    """The model called a tool with arguments it cannot serve; the message is the tool's reply."""


def _json_type(annotation: Any, where: str) -> tuple[str, list[str] | None]:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        values = typing.get_args(annotation)
        return _JSON_TYPES.get(type(values[0]), "string"), [str(v) for v in values]
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _json_type(args[0], where)
    base = origin or annotation
    if base in _JSON_TYPES:
        return _JSON_TYPES[base], None
    raise TypeError(f"{where}: type {annotation!r} has no JSON-schema type; use str, int, float, bool, list or dict")


def _docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """(description, {argument: description}) of a Google-style docstring."""
    lines = inspect.cleandoc(doc or "").splitlines()
    description, arguments, current = [], {}, None
    in_args = False
    for line in lines:
        stripped = line.strip()
        if stripped in ("Args:", "Arguments:", "Parameters:"):
            in_args = True
            continue
        if in_args and re.match(r"^(Returns|Raises|Yields|Examples?):", stripped):
            in_args = False
        if in_args:
            match = re.match(r"^\s+(\w+)\s*(\([^)]*\))?:\s*(.*)$", line)
            if match:
                current = match.group(1)
                arguments[current] = match.group(3)
            elif current and stripped:
                arguments[current] += " " + stripped
        elif stripped or description:
            description.append(stripped)
    return " ".join(" ".join(description).split()), arguments


def schema_of(fn: Callable[..., Any]) -> OpenAIFunctionToolSchema:
    """The OpenAI function schema of `fn` from its signature, type hints and docstring."""
    name = fn.__name__
    hints = typing.get_type_hints(fn)
    description, argument_docs = _docstring_parts(fn.__doc__ or "")
    properties, required = {}, []
    for parameter in inspect.signature(fn).parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if parameter.name not in hints:
            raise TypeError(f"@function_tool {name}: parameter {parameter.name!r} needs a type hint")
        json_type, enum = _json_type(hints[parameter.name], f"@function_tool {name}({parameter.name})")
        properties[parameter.name] = OpenAIFunctionPropertySchema(
            type=json_type, description=argument_docs.get(parameter.name), enum=enum)
        if parameter.default is inspect.Parameter.empty:
            required.append(parameter.name)
    return OpenAIFunctionToolSchema(function=OpenAIFunctionSchema(
        name=name, description=description,
        parameters=OpenAIFunctionParametersSchema(properties=properties, required=required)))


def _in_daemon_thread(fn: Callable[..., Any], kwargs: dict[str, Any]) -> asyncio.Future:
    """`fn(**kwargs)` in a thread of its own: a call that hangs past the tool timeout is abandoned there (a thread
    cannot be stopped) without holding up the event loop's shutdown, as a pooled executor thread would."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def target() -> None:
        try:
            result = fn(**kwargs)
        except BaseException as err:  # handed to the awaiting coroutine
            loop.call_soon_threadsafe(_settle, future, None, err)
        else:
            loop.call_soon_threadsafe(_settle, future, result, None)

    threading.Thread(target=target, name=f"tool-{getattr(fn, '__name__', 'fn')}", daemon=True).start()
    return future


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():  # the caller gave up (timeout) already
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class FunctionTool(BaseTool):
    """A stateless tool around one function (see the module doc)."""

    def __init__(self, fn: Callable[..., Any], config: dict[str, Any] | None = None,
                 tool_schema: OpenAIFunctionToolSchema | None = None) -> None:
        self.fn = fn
        super().__init__(config or {}, tool_schema or schema_of(fn))
        self.__wrapped__ = fn
        self.__doc__ = fn.__doc__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
                      ) -> tuple[ToolResponse, float, dict[str, Any]]:
        known = set(self.tool_schema.function.parameters.properties)
        unknown = sorted(set(parameters) - known)
        missing = [p for p in self.tool_schema.function.parameters.required if p not in parameters]
        if unknown or missing:
            detail = "; ".join(filter(None, [f"unknown arguments {unknown}" if unknown else "",
                                             f"missing arguments {missing}" if missing else ""]))
            return ToolResponse(text=f"error: {self.name}: {detail}"), 0.0, {"error": True}
        try:
            if inspect.iscoroutinefunction(self.fn):
                result = await self.fn(**parameters)
            else:
                result = await _in_daemon_thread(self.fn, parameters)
        except ToolInputError as err:
            return ToolResponse(text=f"error: {err}"), 0.0, {"error": True}
        if isinstance(result, ToolResponse):
            return result, 0.0, {}
        return ToolResponse(text=str(result)), 0.0, {}


def function_tool(fn: Callable[..., Any] | None = None, *, name: str | None = None
                  ) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Decorator: `fn` as a `FunctionTool` (`@function_tool` or `@function_tool(name="calc")`)."""

    def wrap(f: Callable[..., Any]) -> FunctionTool:
        tool = FunctionTool(f)
        if name is not None:
            tool.tool_schema.function.name = name
            tool.name = name
        return tool

    return wrap(fn) if fn is not None else wrap
