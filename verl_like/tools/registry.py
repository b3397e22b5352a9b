"""Tools from a tool config file (verl's format), so verl's `multi_turn.tool_config_path` files load unchanged.

    tools:
      - class_name: verl_like.tools.calculator.calculator   # a BaseTool subclass, or a @function_tool / function
        config: {type: native}
        tool_schema: {type: function, function: {name: calculator, description: ..., parameters: {...}}}

`tool_schema` may be left out where the tool has its own (a @function_tool's comes from its signature).
`verl.tools.*` class names are read as `verl_like.tools.*`.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Any

from verl_like.tools.base_tool import BaseTool
from verl_like.tools.function_tool import FunctionTool
from verl_like.tools.schemas import OpenAIFunctionToolSchema


class ToolConfigError(ValueError):
    """A tool config file names something that cannot be built; the message names the file and the entry."""


def resolve_object(dotted: str, where: str) -> Any:
    """The object `module.path.Name` (or `module.path:Name`) names; `verl.` is read as `verl_like.`."""
    path = dotted.replace(":", ".")
    if path.startswith("verl."):
        path = "verl_like." + path[len("verl."):]
    module_name, _, attribute = path.rpartition(".")
    if not module_name:
        raise ToolConfigError(f"{where}: {dotted!r} is not a dotted path like package.module.Name")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ToolConfigError(f"{where}: cannot import {module_name!r} for {dotted!r}: {err}") from err
    if not hasattr(module, attribute):
        raise ToolConfigError(f"{where}: module {module_name!r} has no {attribute!r}")
    return getattr(module, attribute)


def build_tool(entry: dict[str, Any], where: str) -> BaseTool:
    """One tool from one `tools:` entry."""
    if "class_name" not in entry:
        raise ToolConfigError(f"{where}: an entry needs class_name (a BaseTool subclass or a function)")
    target = resolve_object(str(entry["class_name"]), where)
    config = dict(entry.get("config") or {})
    if config.get("type", "native") != "native":
        raise ToolConfigError(f"{where}: tool type {config['type']!r} is not supported; only native tools "
                              "(MCP servers are not built in: wrap a client in a BaseTool subclass)")
    schema = entry.get("tool_schema")
    tool_schema = OpenAIFunctionToolSchema.model_validate(schema) if schema else None
    if isinstance(target, FunctionTool):
        return FunctionTool(target.fn, config, tool_schema or target.tool_schema)
    if inspect.isclass(target) and issubclass(target, BaseTool):
        return target(config, tool_schema)
    if callable(target) and not inspect.isclass(target):
        return FunctionTool(target, config, tool_schema)
    raise ToolConfigError(f"{where}: {entry['class_name']!r} is neither a BaseTool subclass nor a function")


def resolve_tool_config(path: str | Path) -> Path:
    """The tool config file `path` names: as given (absolute, or from the working directory), else relative to the
    repository root (so a preset's `configs/tools/X.yaml` works from any directory)."""
    from verl_like.config.loader import DEFAULT_CONFIG_DIR

    file = Path(path).expanduser()
    if not file.is_file() and not file.is_absolute():
        file = DEFAULT_CONFIG_DIR.parent / file
    if not file.is_file():
        raise ToolConfigError(f"actor_rollout_ref.rollout.multi_turn.tool_config_path={str(path)!r} does not exist "
                              "(relative paths are read from the working directory, then the repository root)")
    return file


def load_tools(path: str | Path) -> list[BaseTool]:
    """The tools a tool config file declares; names must be unique."""
    import yaml

    file = resolve_tool_config(path)
    document = yaml.safe_load(file.read_text()) or {}
    entries = document.get("tools") if isinstance(document, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ToolConfigError(f"{file}: expected a top-level 'tools:' list with at least one entry")
    tools = [build_tool(dict(entry), f"{file} tools[{i}]") for i, entry in enumerate(entries)]
    names = [tool.name for tool in tools]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ToolConfigError(f"{file}: tool names {duplicates} are declared more than once")
    return tools
