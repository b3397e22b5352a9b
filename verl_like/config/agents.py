"""Cross-field checks of agent loops (`actor_rollout_ref.rollout.multi_turn` / `.agent`), run by `validate`."""

from __future__ import annotations

from pathlib import Path

from verl_like.config.errors import ConfigError
from verl_like.config.ppo import PPOConfig
from verl_like.config.rollout import uses_agent_loops

_P = "actor_rollout_ref.rollout"


def check_agent_loops(config: PPOConfig, check_paths: bool) -> None:
    """Agent loops need the chat messages, one engine per TP-1 rank when colocated, and a tool file that exists."""
    rollout = config.actor_rollout_ref.rollout
    if not uses_agent_loops(rollout):
        return
    if not config.data.return_raw_chat:
        raise ConfigError(
            f"{_P}.multi_turn / {_P}.agent: agent loops build their prompts from each row's chat messages; set "
            "data.return_raw_chat=true")
    if not config.placement.uses_servers and rollout.tensor_model_parallel_size > 1:
        raise ConfigError(
            f"agent loops with {_P}.mode=colocate need {_P}.tensor_model_parallel_size=1 (got "
            f"{rollout.tensor_model_parallel_size}): the engines of a TP group must see identical request streams, "
            f"which tool timing cannot promise; use {_P}.mode=server for TP > 1")
    path = rollout.multi_turn.tool_config_path
    if check_paths and path:
        from verl_like.config.loader import DEFAULT_CONFIG_DIR

        file = Path(path).expanduser()
        if not file.is_file() and not (not file.is_absolute() and (DEFAULT_CONFIG_DIR.parent / file).is_file()):
            raise ConfigError(f"{_P}.multi_turn.tool_config_path={path!r} does not exist (relative paths are read "
                              "from the working directory, then the repository root)")
