"""`tool_agent`: multi-turn tool use. The policy writes a turn; tool calls in it (`multi_turn.format`) run, their
replies are appended as the chat template renders tool turns, and the policy goes on, until it answers without a
call, a turn limit is reached or the response budget (rollout.response_length, all turns) runs out.

Failure policy (docs/agents.md): a malformed call or a call the tool refuses (unknown tool, bad arguments,
`ToolInputError`) gets an error message back as the tool's reply and is counted (agent/malformed_calls,
agent/tool_errors): the policy's own mistake, trained on. A tool that raises anything else, hangs past
`multi_turn.tool_timeout_s` or crashes marks the sample as an infrastructure failure: it leaves the loss and its
group's baseline instead of being scored 0 (agent/infra_failures).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any
from uuid import uuid4

from verl_like.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register
from verl_like.experimental.agent_loop.chat_turns import TurnTemplate
from verl_like.experimental.agent_loop.tool_parser import ToolParser
from verl_like.experimental.agent_loop.vision_turns import loop_image_data
from verl_like.rollout.trajectory import LossMaskReason, Trajectory
from verl_like.tools.base_tool import BaseTool
from verl_like.tools.registry import load_tools
from verl_like.tools.schemas import schema_dict

logger = logging.getLogger(__name__)


class ToolInfraFailure(RuntimeError):
    """A tool raised, hung or crashed: the sample is an infrastructure failure."""


@functools.lru_cache(maxsize=8)
def _tools(path: str | None) -> dict[str, BaseTool]:
    """The tools of a tool config file, built once per process (their per-trajectory state is per instance id)."""
    return {tool.name: tool for tool in load_tools(path)} if path else {}


def truncate_reply(text: str, limit: int, side: str) -> str:
    """`text` cut to `limit` characters: left keeps the start, right the end, middle both ends around '...'."""
    if len(text) <= limit:
        return text
    if side == "left":
        return text[:limit] + "..."
    if side == "right":
        return "..." + text[-limit:]
    half = limit // 2
    return text[:half] + "..." + text[len(text) - (limit - half):]


@register("tool_agent")
class ToolAgentLoop(AgentLoopBase):
    """See the module doc; the multi_turn keys configure it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        rollout = self.config.actor_rollout_ref.rollout
        self.multi_turn = rollout.multi_turn
        self.response_length = int(rollout.response_length)
        self.tools = _tools(self.multi_turn.tool_config_path)
        self.tool_schemas = [schema_dict(tool.tool_schema) for tool in self.tools.values()]
        self.tool_parser = ToolParser.get_tool_parser(self.multi_turn.format, self.tokenizer)
        self.turns = TurnTemplate(self.tokenizer, **self.apply_chat_template_kwargs)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        messages = list(kwargs["raw_prompt"])
        extra_info = kwargs.get("extra_info") or {}
        tools_kwargs = kwargs.get("tools_kwargs") or extra_info.get("tools_kwargs") or {}
        prompt_ids = await self.apply_chat_template(messages, tools=self.tool_schemas)
        ledger = Trajectory(list(prompt_ids), num_turns=len(messages))
        images = loop_image_data(kwargs)  # sent with every turn (vision_turns.py)
        instances: dict[str, str] = {}
        latencies: list[float] = []
        request_id = uuid4().hex
        assistant_turns = user_turns = 0
        generate_s = 0.0
        try:
            while len(ledger.response_ids) < self.response_length:
                start = time.perf_counter()
                out = await self.server_manager.generate(
                    request_id=request_id, prompt_ids=ledger.prompt_ids + ledger.response_ids,
                    sampling_params=sampling_params, image_data=images)
                generate_s += time.perf_counter() - start
                if out.prompt_ids is not None and not ledger.response_ids:
                    ledger.prompt_ids = list(out.prompt_ids)  # the template's placeholders, as the engine expanded them
                ledger.add_sampled(out.token_ids, out.log_probs or [0.0] * len(out.token_ids))
                assistant_turns += 1
                ledger.num_turns += 1
                if out.finish_reason == "length" or len(ledger.response_ids) >= self.response_length:
                    ledger.truncated = True  # the response budget (all turns) ran out mid-answer
                    break
                limit = self.multi_turn.max_assistant_turns
                if limit is not None and assistant_turns >= limit:
                    break
                parsed = self.tool_parser.parse(self.tokenizer.decode(out.token_ids, skip_special_tokens=False))
                if not parsed.calls and not parsed.malformed:
                    break
                replies = [f"error: malformed tool call: {reason}" for reason in parsed.malformed]
                ledger.malformed_calls += len(parsed.malformed)
                calls = parsed.calls[: self.multi_turn.max_parallel_calls]
                results = await asyncio.gather(*(self._call(call, instances, tools_kwargs, ledger, latencies)
                                                 for call in calls))
                replies += results
                side, most = self.multi_turn.tool_response_truncate_side, self.multi_turn.max_tool_response_length
                inserted = self.turns.append([{"role": "tool", "content": truncate_reply(r, most, side)}
                                              for r in replies])
                for token, reason in zip(inserted.ids, inserted.reasons):
                    ledger.add_inserted([token], LossMaskReason(reason))
                ledger.num_turns += len(replies)
                user_turns += 1
                limit = self.multi_turn.max_user_turns
                if limit is not None and user_turns >= limit:
                    break
        except ToolInfraFailure as err:
            ledger.infra_failure = str(err)
        finally:
            await self._finish(instances, ledger)
        ledger.extra.update(tool_latency_s=latencies, generate_s=generate_s)
        return ledger_output(ledger)

    async def _call(self, call: Any, instances: dict[str, str], tools_kwargs: dict[str, Any], ledger: Trajectory,
                    latencies: list[float]) -> str:
        """The reply to one call; raises ToolInfraFailure when the tool raised, hung or crashed."""
        ledger.tool_calls += 1
        tool = self.tools.get(call.name)
        if tool is None:
            ledger.tool_errors += 1
            return f"error: unknown tool {call.name!r}; available: {sorted(self.tools)}"
        own = tools_kwargs.get(call.name, {}) or {}
        timeout = self.multi_turn.tool_timeout_s
        start = time.perf_counter()
        try:
            if call.name not in instances:
                instances[call.name], _ = await asyncio.wait_for(
                    tool.create(**dict(own.get("create_kwargs", {}) or {})), timeout)
            response, reward, metrics = await asyncio.wait_for(
                tool.execute(instances[call.name], call.arguments, **dict(own.get("execute_kwargs", {}) or {})),
                timeout)
        except asyncio.TimeoutError as err:
            raise ToolInfraFailure(f"tool {call.name!r} did not answer within multi_turn.tool_timeout_s="
                                   f"{timeout:g} s") from err
        except Exception as err:
            raise ToolInfraFailure(f"tool {call.name!r} raised {type(err).__name__}: {err}") from err
        finally:
            latencies.append(time.perf_counter() - start)
        if reward:
            ledger.turn_rewards.append(float(reward))
        if (metrics or {}).get("error"):
            ledger.tool_errors += 1
        return response.text or ""

    async def _finish(self, instances: dict[str, str], ledger: Trajectory) -> None:
        """Final tool rewards and release of every instance (a failing release is logged, not raised)."""
        timeout = self.multi_turn.tool_timeout_s
        for name, instance_id in instances.items():
            tool = self.tools[name]
            try:
                if ledger.infra_failure is None:
                    reward = await asyncio.wait_for(tool.calc_reward(instance_id), timeout)
                    if reward:
                        ledger.turn_rewards.append(float(reward))
                await asyncio.wait_for(tool.release(instance_id), timeout)
            except Exception as err:  # the sample's tokens are complete; a dying tool must not lose them
                logger.warning("tool %r: calc_reward/release of instance %s failed: %s", name, instance_id, err)


def ledger_output(ledger: Trajectory) -> AgentLoopOutput:
    """An AgentLoopOutput carrying a whole ledger (the runner reads it back exactly)."""
    return AgentLoopOutput(
        prompt_ids=ledger.prompt_ids, response_ids=ledger.response_ids,
        response_mask=[int(r == LossMaskReason.TRAINED) for r in ledger.mask_reason],
        response_logprobs=ledger.log_probs, num_turns=ledger.num_turns,
        metrics={"generate_sequences": ledger.extra.get("generate_s", 0.0),
                 "tool_calls": sum(ledger.extra.get("tool_latency_s", []))},
        extra_fields={"trajectory": ledger},
    )
