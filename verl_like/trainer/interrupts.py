"""Graceful stop on SIGTERM / SIGINT (preemption, `ray job stop`, Ctrl-C): finish the step, checkpoint, exit.

The first signal only sets a flag: the trainer loop finishes the step it is in, writes a checkpoint and raises
TrainingInterrupted. A second signal abandons the step at once (KeyboardInterrupt); the previous checkpoint is
intact either way (checkpoints are committed atomically).
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Any

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class TrainingInterrupted(RuntimeError):
    """Training stopped on a signal after `step`; `checkpoint` is the folder written then (None: none written)."""

    def __init__(self, signum: int, step: int, checkpoint: str | None) -> None:
        name = signal.Signals(signum).name
        where = f"checkpoint {checkpoint} written" if checkpoint else "no checkpoint (trainer.save_freq=-1, or step 0)"
        super().__init__(f"stopped by {name} after step {step}; {where}")
        self.signum = signum
        self.step = step
        self.checkpoint = checkpoint

    @property
    def exit_code(self) -> int:
        """The shell's code for death by this signal (143 for SIGTERM, 130 for SIGINT)."""
        return 128 + self.signum


class StopRequests:
    """Context manager: while inside, SIGTERM/SIGINT set `requested` instead of killing the process.

    Installs handlers only in the main thread (Python delivers signals there); elsewhere it is inert.
    """

    def __init__(self) -> None:
        self.requested: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested is not None:
            logger.warning("second %s: abandoning the current step", signal.Signals(signum).name)
            raise KeyboardInterrupt
        self.requested = signum
        logger.warning(
            "%s received: finishing the current step, then checkpointing and stopping (send it again to abandon the "
            "step)", signal.Signals(signum).name,
        )

    def __enter__(self) -> StopRequests:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
