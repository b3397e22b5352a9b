"""An agent loop and a tool written as verl documents them, with only `verl` -> `verl_like` in the imports."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import uuid4

from verl_like.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register
from verl_like.tools import function_tool
from verl_like.utils.profiler import simple_timer
from verl_like.utils.rollout_trace import rollout_trace_op

# Samples of one rollout that finished their second turn; a tool call waits for one (see SlowTool).
second_turns_done: asyncio.Event | None = None


@function_tool
def add(a: int, b: int) -> str:
    """Adds two integers.

    Args:
        a: the first.
        b: the second.
    """
    return str(a + b)


@register("two_turn_agent")
class TwoTurnAgent(AgentLoopBase):
    """Turn 1, a call to `add`, the tool's reply through the chat template, turn 2 (verl's ToolAgentLoop shape)."""

    @rollout_trace_op
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        messages = list(kwargs["raw_prompt"])
        prompt_ids = await self.apply_chat_template(messages)
        metrics: dict[str, float] = {}
        request_id = uuid4().hex
        with simple_timer("generate_sequences", metrics):
            first = await self.server_manager.generate(
                request_id=request_id, prompt_ids=prompt_ids, sampling_params={**sampling_params, "max_tokens": 6})
        response_ids, response_mask = list(first.token_ids), [1] * len(first.token_ids)
        logprobs = list(first.log_probs)
        slow = kwargs.get("extra_info", {}).get("slow_tool", False)
        if slow:  # this sample's tool waits until another sample finished its second turn
            await asyncio.wait_for(second_turns_done.wait(), timeout=60)
        reply, _, _ = await add.execute(request_id, {"a": 2, "b": 3})
        tool_ids = await self.apply_chat_template([{"role": "tool", "content": reply.text}],
                                                  remove_system_prompt=True)
        response_ids += tool_ids
        response_mask += [0] * len(tool_ids)
        logprobs += [0.0] * len(tool_ids)
        with simple_timer("generate_sequences", metrics):
            second = await self.server_manager.generate(
                request_id=request_id, prompt_ids=prompt_ids + response_ids,
                sampling_params={**sampling_params, "max_tokens": 6})
        if not slow and second_turns_done is not None:
            second_turns_done.set()
        response_ids += second.token_ids
        response_mask += [1] * len(second.token_ids)
        logprobs += second.log_probs
        return AgentLoopOutput(prompt_ids=prompt_ids, response_ids=response_ids, response_mask=response_mask,
                               response_logprobs=logprobs, num_turns=4, metrics=metrics,
                               extra_fields={"tool_calls": 1})
