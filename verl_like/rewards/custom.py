"""Loads a user's reward function from a Python file: `path` + function `name`.

The function is called with keywords: `fn(data_source=..., solution_str=..., ground_truth=..., extra_info=...)`
and returns a float (or a dict with a float under "score").
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Callable

import cloudpickle

REWARD_ARGUMENTS = ("data_source", "solution_str", "ground_truth", "extra_info")


class CustomRewardError(ValueError):
    """A custom reward function that cannot be loaded or called as a reward function."""


def check_reward_signature(fn: Callable, where: str) -> None:
    """Raises CustomRewardError unless `fn` accepts the four reward keywords."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins without a signature: trust the caller
    try:
        signature.bind(**{name: None for name in REWARD_ARGUMENTS})
    except TypeError as error:
        raise CustomRewardError(
            f"{where}: signature {signature} cannot take the reward arguments ({error}); define it as "
            "def fn(data_source, solution_str, ground_truth, extra_info=None) -> float"
        ) from error


def load_custom_function(path: str, name: str) -> Callable:
    """The function `name` defined in the Python file `path`, checked to accept the reward arguments."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise CustomRewardError(
            f"custom reward file {path!r} does not exist; set custom_reward_function.path to a .py file"
        )
    module_name = f"verl_like_custom_reward_{abs(hash(str(file.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise CustomRewardError(f"custom reward file {path!r} is not a Python module; give a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # lets dataclasses/pickle inside the file resolve their module
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        sys.modules.pop(module_name, None)
        raise CustomRewardError(
            f"custom reward file {path!r} failed to import: {type(error).__name__}: {error}"
        ) from error
    if not hasattr(module, name):
        functions = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise CustomRewardError(
            f"custom reward file {path!r} defines no {name!r}; callables in it: {functions}; set "
            "custom_reward_function.name"
        )
    fn = getattr(module, name)
    if not callable(fn):
        raise CustomRewardError(f"{name!r} in custom reward file {path!r} is a {type(fn).__name__}, not a function")
    check_reward_signature(fn, f"{name!r} in {path!r}")
    # Scoring workers cannot import this module by name: ship its functions by value instead.
    cloudpickle.register_pickle_by_value(module)
    return fn
