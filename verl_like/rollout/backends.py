"""The code side of the rollout-backend registry (config/rollout_backends.py): build the engine an entry names.

    build = EngineBuild(model_path, rollout_config, hf_config, override_config, trust_remote_code, lora_rank)
    engine = build_rollout_engine(build)       # the entry of rollout.name: builder(model_path, options(build))
    backend = server_backend("vllm")            # its ServerBackend (rollout/server_backend.py)

An entry's builder, options and server are callables or "module:attribute" paths; they are imported here, in the
process that builds the engine or talks to the servers, never by config/.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from verl_like.config.errors import ConfigError
from verl_like.config.rollout import RolloutConfig
from verl_like.config.rollout_backends import NAME_KEY, rollout_backend

if TYPE_CHECKING:
    from verl_like.rollout.base import RolloutEngine
    from verl_like.rollout.server_backend import ServerBackend


@dataclass(frozen=True)
class EngineBuild:
    """What every backend's `options` function reads.

    model_path: the policy's local HF directory. rollout: the `actor_rollout_ref.rollout` node.
    hf_config: the policy's HF config with actor_rollout_ref.model.override_config applied (what the training
      engine builds). override_config: that node as given. trust_remote_code: actor_rollout_ref.model's.
    lora_rank: the rank of the adapter the engine will serve (0: none, also with lora.merge: merged weights).
    """

    model_path: str
    rollout: RolloutConfig
    hf_config: Any
    override_config: Mapping[str, Any] = field(default_factory=dict)
    trust_remote_code: bool = False
    lora_rank: int = 0


def resolve(target: Any) -> Any:
    """`target` itself when it is not a string, else the object a "module:attribute.path" string names."""
    if not isinstance(target, str):
        return target
    module_name, _, attribute = target.partition(":")
    found: Any = importlib.import_module(module_name)
    for part in attribute.split(".") if attribute else ():
        found = getattr(found, part)
    return found


def build_rollout_engine(build: EngineBuild) -> RolloutEngine:
    """The in-process engine of `build.rollout.name`: its entry's builder(model_path, options(build))."""
    backend = rollout_backend(build.rollout.name)
    return resolve(backend.builder)(build.model_path, resolve(backend.options)(build))


def server_backend(name: str) -> ServerBackend:
    """The ServerBackend of the rollout backend `name`; ConfigError when it has no server mode."""
    backend = rollout_backend(name)
    if backend.server is None:
        raise ConfigError(f"{NAME_KEY}={name!r} ({backend.label}) has no server mode")
    return resolve(backend.server)
