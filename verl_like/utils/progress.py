"""`phase(label)`: a start-up phase that says it is still running (a first run on 2 loaded cores spent minutes
starting workers and engines with no output).

    with phase("starting the trainer's worker processes"):
        group = WorkerGroup(...)

Logs `label` once the phase has run `every_s` seconds, again every `every_s` while it runs, and how long it took
when it was reported; a phase shorter than `every_s` logs nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

logger = logging.getLogger(__name__)


@contextmanager
def phase(label: str, every_s: float = 10.0, log: logging.Logger = logger) -> Iterator[None]:
    """Runs the body while a daemon thread logs `label: still running (N s)` every `every_s` seconds."""
    done = threading.Event()
    started = time.monotonic()
    reported = threading.Event()

    def report() -> None:
        while not done.wait(every_s):
            reported.set()
            log.info("%s: still running (%.0f s)", label, time.monotonic() - started)

    ticker = threading.Thread(target=report, name=f"progress: {label}", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
        if reported.is_set():
            log.info("%s: done in %.0f s", label, time.monotonic() - started)
