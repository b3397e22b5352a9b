"""Adapts a user's ActorRolloutWorker subclass to the framework: the tutorial's shape works as written.

verl's vLLM tutorial writes a worker like this, with its own constructor and no `super().__init__`:

    class VLLMActorWorker(ActorRolloutWorker):
        def __init__(self, model_name, tensor_parallel_size=1):
            self.llm = LLM(model=model_name, tensor_parallel_size=tensor_parallel_size, dtype="half")
        def generate(self, prompts):
            return [o.outputs[0].text for o in self.llm.generate(prompts, self.sampling_params)]

`adapt_worker_class(cls)` returns the class the worker group constructs:
- when `cls.__init__` does not take the framework's arguments (`model_path`, `actor`, `rollout`, ...), a subclass
  whose constructor first runs `ActorRolloutWorker.__init__` with the framework's arguments (joining the
  torch.distributed world, loading the tokenizer) and then the user's constructor with `actor_rollout_kwargs`;
- when `cls` overrides `generate` but not `update_rollout_weights`, a subclass whose `update_rollout_weights`
  loads the policy's new weights into every `vllm.LLM` the worker holds as an attribute (then resets its prefix
  cache), so the user's engine never samples from a stale policy;
- otherwise `cls` itself (a worker that calls `super().__init__(*args, **kwargs)` and syncs its own engine).
"""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Iterable
from typing import Any

import torch

from verl_like.workers.actor_rollout import ActorRolloutWorker

logger = logging.getLogger(__name__)

# ActorRolloutWorker.__init__'s parameters: what the framework passes to every actor-rollout worker.
FRAMEWORK_ARGS = tuple(p for p in inspect.signature(ActorRolloutWorker.__init__).parameters if p != "self")
# Keyword arguments of a user's worker that name the model it generates with; the actor then trains that model.
MODEL_NAME_KWARGS = ("model_name", "model_path", "model")


def takes_framework_args(cls: type) -> bool:
    """Whether `cls.__init__` accepts the framework's arguments (its own, `*args`/`**kwargs`, or `model_path`)."""
    init = cls.__init__
    if init is ActorRolloutWorker.__init__:
        return True
    params = inspect.signature(init).parameters.values()
    variadic = any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params)
    return variadic or "model_path" in {p.name for p in params}


def accepts_keyword(cls: type, name: str) -> bool:
    """Whether `cls(...)` takes the keyword argument `name` (named in its constructor, or through **kwargs)."""
    params = inspect.signature(cls.__init__).parameters.values()
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in params)


def _overrides(cls: type, name: str) -> bool:
    return getattr(cls, name) is not getattr(ActorRolloutWorker, name)


def check_worker_class(cls: Any) -> None:
    """Raises TypeError when `cls` cannot serve as the actor-rollout worker, saying what to change."""
    where = "PPOTrainer(actor_rollout_worker=...)"
    if not isinstance(cls, type):
        raise TypeError(f"{where} must be a class, got {cls!r}; pass the class itself, not an instance")
    if not issubclass(cls, ActorRolloutWorker):
        raise TypeError(
            f"{where}: {cls.__module__}.{cls.__qualname__} is not a subclass of ActorRolloutWorker; declare it as "
            "`class MyWorker(ActorRolloutWorker)` with `from verl_like.workers import ActorRolloutWorker`"
        )
    if not takes_framework_args(cls) and not (_overrides(cls, "generate") or _overrides(cls, "build_rollout_engine")):
        raise TypeError(
            f"{where}: {cls.__qualname__} has its own constructor but no generate(self, prompts: list[str]) -> "
            "list[str] method (nor build_rollout_engine); define generate to return one response text per prompt"
        )


def model_named_by(kwargs: dict[str, Any]) -> str | None:
    """The model a user's worker kwargs name (`model_name`, `model_path` or `model`), or None."""
    return next((str(kwargs[key]) for key in MODEL_NAME_KWARGS if isinstance(kwargs.get(key), str)), None)


def adapt_worker_class(cls: type) -> type:
    """The class the worker group constructs for the user's `cls` (see the module doc)."""
    check_worker_class(cls)
    user_init = None if takes_framework_args(cls) else cls.__init__
    pushes_weights = _overrides(cls, "generate") and not _overrides(cls, "update_rollout_weights")
    if user_init is None and not pushes_weights:
        logger.info("actor-rollout worker %s.%s: used as it is", cls.__module__, cls.__qualname__)
        return cls
    namespace: dict[str, Any] = {"__doc__": cls.__doc__, "__module__": __name__, "__qualname__": cls.__qualname__}
    if user_init is not None:

        def __init__(self: ActorRolloutWorker, **kwargs: Any) -> None:
            framework = {key: kwargs.pop(key) for key in FRAMEWORK_ARGS if key in kwargs}
            ActorRolloutWorker.__init__(self, **framework)
            user_init(self, **kwargs)

        namespace["__init__"] = __init__
    if pushes_weights:
        namespace["update_rollout_weights"] = push_weights_to_held_llms
    adapted = type(cls.__name__, (cls,), namespace)
    logger.info(
        "actor-rollout worker %s.%s: %s; %s", cls.__module__, cls.__qualname__,
        "the framework sets up ActorRolloutWorker, then runs its constructor with actor_rollout_kwargs"
        if user_init is not None else "its constructor gets the framework's arguments",
        "new weights go into every vllm.LLM it holds" if pushes_weights else "it loads new weights itself",
    )
    return adapted


def held_llms(worker: Any) -> list[Any]:
    """The `vllm.LLM` objects among the worker's attributes (none when vLLM was never imported)."""
    vllm = sys.modules.get("vllm")
    llm_type = getattr(vllm, "LLM", None)
    if llm_type is None:
        return []
    return [value for value in vars(worker).values() if isinstance(value, llm_type)]


def _llm_dtype(llm: Any) -> torch.dtype | None:
    return getattr(getattr(getattr(llm, "llm_engine", None), "model_config", None), "dtype", None)


def push_weights_to_held_llms(self: ActorRolloutWorker, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """update_rollout_weights for a worker with its own vLLM engine(s): loads the policy's (HF name, full
    tensor) pairs into each held `vllm.LLM` (cast to its dtype) and resets its prefix cache."""
    from verl_like.rollout.vllm_compat import load_full_weights

    llms = held_llms(self)
    if not llms:
        if not self.__dict__.get("_warned_no_llm"):
            self._warned_no_llm = True
            logger.warning(
                "%s generates with an engine that is not a vllm.LLM attribute of the worker, and does not override "
                "update_rollout_weights: its engine keeps the initial weights (STALE POLICY). Keep the engine as an "
                "attribute (self.llm = LLM(...)) or override update_rollout_weights(named_tensors).",
                type(self).__name__,
            )
        return
    tensors = list(named_tensors) if len(llms) > 1 else named_tensors
    for llm in llms:
        dtype = _llm_dtype(llm)
        load_full_weights(llm, ((name, t.to(dtype) if dtype is not None else t) for name, t in tensors))
        llm.reset_prefix_cache()  # cached prompt KV was computed with the old weights
