"""`simple_timer` (verl's `verl.utils.profiler` name): times a block into a dict of seconds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def simple_timer(name: str, timing_raw: dict[str, float]) -> Iterator[None]:
    """Adds the block's wall time in seconds to `timing_raw[name]` (summed over repeated blocks)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timing_raw[name] = timing_raw.get(name, 0.0) + time.perf_counter() - start
