"""Agent loops on a worker's own engine (colocated placement): which batches take them, and the call."""

from __future__ import annotations

from typing import Any

from verl_like.protocol import DataProto
from verl_like.rollout.base import SamplingConfig


def rows_use_agent_loops(runner: Any, prompts: DataProto) -> bool:
    """True when agent loops are configured (`runner` set); rows that name a loop while they are off raise."""
    if runner is not None:
        return True
    names = prompts.non_tensor_batch.get("agent_name")
    if names is not None and any(name and name != "single_turn_agent" for name in names):
        raise ValueError(
            f"rows name agent loops {sorted(set(map(str, names)))} (column agent_name) but agent loops are off; set "
            "actor_rollout_ref.rollout.multi_turn.enable=true or actor_rollout_ref.rollout.agent.default_agent_loop")
    return False


def engine_agent_rollout(runner: Any, engine: Any, prompts: DataProto, sampling: SamplingConfig,
                         max_model_len: int, version: int) -> DataProto:
    """The chunk's rollout through agent loops on `engine` (a RolloutEngine), one asyncio task per sample;
    `version`: the weight version the engine holds (each turn records it)."""
    if engine is None:
        raise RuntimeError("this worker generates through a text hook; agent loops need a token-level engine "
                           "(vLLM, HF, or a RolloutEngine with token_generator())")
    generator = engine.token_generator(max_model_len)
    generator.version = version
    try:
        return runner.run_sync(prompts, sampling, generator, int(runner.tokenizer.pad_token_id))
    finally:
        generator.close()


def check_chat_template(tokenizer: Any, config: Any) -> None:
    """Raises TemplateError when the chat template cannot be extended turn by turn (multi_turn's
    tokenization_sanity_check_mode says how strictly); run before the first rollout."""
    from verl_like.experimental.agent_loop.chat_turns import TemplateError, check_template

    multi_turn = config.actor_rollout_ref.rollout.multi_turn
    if not multi_turn.enable:
        return
    name = f"the chat template of {getattr(tokenizer, 'name_or_path', 'the tokenizer')}"
    problem = check_template(tokenizer, name, multi_turn.tokenization_sanity_check_mode)
    if problem:
        raise TemplateError(problem)
