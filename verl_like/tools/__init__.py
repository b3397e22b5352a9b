"""Tools for agent loops: stateful `BaseTool`s, plain functions with `@function_tool`, tool config files."""

from verl_like.tools.base_tool import BaseTool
from verl_like.tools.function_tool import FunctionTool, ToolInputError, function_tool
from verl_like.tools.registry import ToolConfigError, load_tools
from verl_like.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

__all__ = ["BaseTool", "FunctionTool", "OpenAIFunctionToolSchema", "ToolConfigError", "ToolInputError",
           "ToolResponse", "function_tool", "load_tools"]
