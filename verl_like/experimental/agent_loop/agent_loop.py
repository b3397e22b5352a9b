"""verl's agent-loop API, importable where verl users import it (`verl` -> `verl_like`).

    from verl_like.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register

    @register("my_agent")
    class MyAgent(AgentLoopBase):
        async def run(self, sampling_params, **kwargs) -> AgentLoopOutput:
            prompt_ids = await self.apply_chat_template(kwargs["raw_prompt"])
            out = await self.server_manager.generate(request_id=uuid4().hex, prompt_ids=prompt_ids,
                                                     sampling_params=sampling_params)
            return AgentLoopOutput(prompt_ids=prompt_ids, response_ids=out.token_ids,
                                   response_mask=[1] * len(out.token_ids), response_logprobs=out.log_probs,
                                   num_turns=2, metrics={})

One instance runs one sample (`run` gets the sample's dataset columns as keywords: raw_prompt, data_source,
extra_info, tools_kwargs, index, ...). `self.config` is the whole config with verl's key names (an OmegaConf
DictConfig), `self.server_manager.generate` the token-level generate of whatever placement the run uses.
`response_mask` is 1 for the policy's sampled tokens and 0 for inserted ones; a loop may give the reason of each
0 in `extra_fields["loss_mask_reason"]` (verl_like.rollout.trajectory.LossMaskReason values, TOOL by default).
"""

from __future__ import annotations

import abc
import asyncio
import importlib
import logging
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from verl_like.experimental.agent_loop.chat_turns import render
from verl_like.rollout.token_generate import TokenGenerator, TokenOutput

logger = logging.getLogger(__name__)

# verl's name for what agent loops call; here every placement's token generator.
AsyncLLMServerManager = TokenGenerator
__all__ = ["AgentLoopBase", "AgentLoopMetrics", "AgentLoopOutput", "AsyncLLMServerManager", "DictConfigWrap",
           "TokenOutput", "register"]


class AgentLoopMetrics(BaseModel):
    """Per-sample timings: seconds generating and in tool calls; preemptions (-1: not known)."""

    model_config = ConfigDict(extra="allow")
    generate_sequences: float = 0.0
    tool_calls: float = 0.0
    num_preempted: int = -1


class AgentLoopOutput(BaseModel):
    """What `run` returns: the sample's prompt ids and everything after them (see the module doc)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None = None
    routed_experts: Any = None
    multi_modal_data: dict[str, Any] | None = None
    reward_score: float | None = None
    num_turns: int = 0
    metrics: AgentLoopMetrics = Field(default_factory=AgentLoopMetrics)
    extra_fields: dict[str, Any] = Field(default_factory=dict)


class DictConfigWrap:
    """verl's wrapper of the config handed to agent loops (`trainer_config.config`)."""

    def __init__(self, config: Any) -> None:
        self.config = config


def _system_prompt_ids(tokenizer: Any, kwargs: dict[str, Any]) -> list[int]:
    """The ids a chat template puts before the first message when none is a system message (verl strips them from
    templated tool turns); [] for templates that add none or cannot render an empty conversation."""
    try:
        return render(tokenizer, [{}], False, **kwargs)
    except Exception:  # a template that insists on real messages adds no default system prompt we could strip
        return []


class AgentLoopBase(abc.ABC):
    """An agent loop: builds one sample's trajectory by calling the policy (`server_manager`) and tools."""

    def __init__(self, trainer_config: DictConfigWrap, server_manager: Any, tokenizer: Any, processor: Any = None,
                 dataset_cls: Any = None, dataset_config: Any = None, **kwargs: Any) -> None:
        self.config = trainer_config.config
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.processor = processor
        self.dataset_cls = dataset_cls
        self.dataset_config = dataset_config.config if isinstance(dataset_config, DictConfigWrap) else (
            dataset_config if dataset_config is not None else self.config.data)
        self.apply_chat_template_kwargs = dict(self.dataset_config.get("apply_chat_template_kwargs", None) or {})
        self.system_prompt = _system_prompt_ids(tokenizer, self.apply_chat_template_kwargs)
        self.loop = asyncio.get_running_loop()

    async def apply_chat_template(self, messages: list[dict], tools: list[dict] | None = None, images: Any = None,
                                  videos: Any = None, remove_system_prompt: bool = False) -> list[int]:
        """The token ids of `messages` through the tokenizer's chat template, ending in the generation prompt."""
        if images or videos:
            raise NotImplementedError("image and video prompts are not supported by this agent loop runtime")

        kwargs = dict(self.apply_chat_template_kwargs, **({"tools": tools} if tools else {}))
        prompt_ids = await self.loop.run_in_executor(None, lambda: render(self.tokenizer, messages, True, **kwargs))
        if remove_system_prompt and self.system_prompt and prompt_ids[:len(self.system_prompt)] == self.system_prompt:
            prompt_ids = prompt_ids[len(self.system_prompt):]
        return prompt_ids

    async def process_vision_info(self, messages: list[dict]) -> dict:
        """Images and videos of `messages` (none: this runtime serves text-only loops)."""
        return {}

    @abc.abstractmethod
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """One sample's trajectory; `kwargs` are its dataset columns."""


# name -> {"_target_": "module.Class", ...constructor keywords}; verl's registry shape.
_agent_loop_registry: dict[str, dict[str, Any]] = {}


def register(agent_name: str):
    """Class decorator: the agent loop that the dataset column `agent_name` (or agent.default_agent_loop) names."""

    def decorator(subclass: type[AgentLoopBase]) -> type[AgentLoopBase]:
        _agent_loop_registry[agent_name] = {"_target_": f"{subclass.__module__}.{subclass.__qualname__}"}
        return subclass

    return decorator


def load_agent_loop_config(path: str) -> list[str]:
    """Registers the loops of an `agent.agent_loop_config_path` file (a list of {name, _target_, ...}); returns
    their names."""
    from omegaconf import OmegaConf

    entries = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    if not isinstance(entries, list):
        raise ValueError(f"actor_rollout_ref.rollout.agent.agent_loop_config_path={path!r}: expected a list of "
                         "{name: ..., _target_: module.Class} entries")
    names = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "name" not in entry or "_target_" not in entry:
            raise ValueError(f"{path} entry {i}: needs 'name' and '_target_' (module.Class of an AgentLoopBase)")
        name = entry.pop("name")
        _agent_loop_registry[name] = entry
        names.append(name)
    return names


def agent_loop_class(name: str) -> tuple[type[AgentLoopBase], dict[str, Any]]:
    """The class registered as `name` and its extra constructor keywords."""
    if name not in _agent_loop_registry:
        raise KeyError(f"agent loop {name!r} is not registered (known: {sorted(_agent_loop_registry)}); decorate "
                       "its class with @register(name) in a module the run imports, or list it in "
                       "actor_rollout_ref.rollout.agent.agent_loop_config_path")
    entry = dict(_agent_loop_registry[name])
    target = entry.pop("_target_").replace("verl.experimental", "verl_like.experimental")
    module_name, _, class_name = target.rpartition(".")
    cls = getattr(importlib.import_module(module_name), class_name)
    if not (isinstance(cls, type) and issubclass(cls, AgentLoopBase)):
        raise TypeError(f"agent loop {name!r}: {target} is not a subclass of AgentLoopBase")
    return cls, entry
