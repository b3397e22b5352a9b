"""`single_turn_agent`: one generate call per sample (the default loop; also what a batch without agent loops does
in one batched engine call)."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from verl_like.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register
from verl_like.experimental.agent_loop.vision_turns import loop_image_data
from verl_like.utils.profiler import simple_timer


@register("single_turn_agent")
class SingleTurnAgentLoop(AgentLoopBase):
    """Generates one response to the sample's prompt: the dataset's prompt ids when the runner passes them (the
    same tokens as the batched path), else its chat messages through the template. The sample's images go along
    as `image_data` (experimental/agent_loop/vision_turns.py)."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        prompt_ids = kwargs.get("prompt_ids")
        if prompt_ids is None:
            prompt_ids = await self.apply_chat_template(list(kwargs["raw_prompt"]))
        metrics: dict[str, float] = {}
        with simple_timer("generate_sequences", metrics):
            output = await self.server_manager.generate(request_id=uuid4().hex, prompt_ids=list(prompt_ids),
                                                        sampling_params=sampling_params,
                                                        image_data=loop_image_data(kwargs))
        if output.prompt_ids is not None:  # an image prompt sent unexpanded: the engine's expansion is the prompt
            prompt_ids = output.prompt_ids
        return AgentLoopOutput(prompt_ids=list(prompt_ids), response_ids=output.token_ids,
                               response_mask=[1] * len(output.token_ids), response_logprobs=output.log_probs,
                               num_turns=2, metrics=metrics)
