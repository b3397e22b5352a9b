"""Agent loops (verl's `verl.experimental.agent_loop` API): `AgentLoopBase`, `@register`, the built-in
`single_turn_agent` and `tool_agent`, and the runner that builds rollout batches from them (docs/agents.md)."""

from verl_like.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    AsyncLLMServerManager,
    DictConfigWrap,
    register,
)
from verl_like.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
from verl_like.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

__all__ = ["AgentLoopBase", "AgentLoopMetrics", "AgentLoopOutput", "AsyncLLMServerManager", "DictConfigWrap",
           "SingleTurnAgentLoop", "ToolAgentLoop", "register"]
