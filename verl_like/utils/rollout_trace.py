"""`rollout_trace_op` and `rollout_trace_attr` (verl's `verl.utils.rollout_trace` names).

verl sends these spans to a tracing backend (weave, mlflow). Here a decorated coroutine's calls are counted and
timed under its qualified name in `trace_stats()` (the agent runner reports them as agent/trace/* metrics);
`rollout_trace_attr` is accepted and sets nothing. No backend is needed and nothing leaves the process.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

_lock = threading.Lock()
_stats: dict[str, list[float]] = {}


def _record(name: str, seconds: float) -> None:
    with _lock:
        entry = _stats.setdefault(name, [0.0, 0.0])
        entry[0] += 1
        entry[1] += seconds


def rollout_trace_op(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for sync or async functions: counts and times their calls."""
    name = fn.__qualname__
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                _record(name, time.perf_counter() - start)
        return async_wrapper

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _record(name, time.perf_counter() - start)
    return wrapper


@contextmanager
def rollout_trace_attr(**attributes: Any) -> Iterator[None]:
    """verl's span attributes (step, sample_index, ...): accepted, not recorded."""
    yield


def trace_stats(reset: bool = True) -> dict[str, tuple[int, float]]:
    """{qualified name: (calls, seconds)} since the last reset."""
    with _lock:
        out = {name: (int(calls), seconds) for name, (calls, seconds) in _stats.items()}
        if reset:
            _stats.clear()
    return out
