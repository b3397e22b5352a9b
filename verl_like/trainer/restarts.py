"""`fit_with_restarts`: a run that goes on after a trainer worker died (`trainer.max_restarts`), torchelastic-style.

When a worker of any group dies (`WorkerDiedError`: kill -9, OOM, a lost node), the driver releases every group,
starts them again in the same process and resumes from the newest committed checkpoint in
`trainer.default_local_dir`, exactly as a manual `resume_mode=auto` run would (loader position, RNG, KL
controller, and the asynchronous driver's batches regenerated from the checkpoint's loader state): the steps after
the checkpoint are trained again, none twice in the logged result. Up to max_restarts times per run; a death at
the same step as the previous one ends the run with both errors (a fault that repeats is not a restart loop).
Other errors end the run as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from verl_like.single_controller.errors import WorkerDiedError

logger = logging.getLogger(__name__)


class RepeatedFaultError(RuntimeError):
    """A trainer worker died twice at the same step; the message holds both errors."""


def fit_with_restarts(fit: Callable[[], dict[str, float]], restart: Callable[[], None],
                      step: Callable[[], int], max_restarts: int) -> dict[str, float]:
    """Runs `fit()`; after a WorkerDiedError, `restart()` (release and start the groups again, resume from the
    newest checkpoint) and `fit()` again, at most `max_restarts` times. `step()`: the last finished step (the
    death is counted at the step after it)."""
    failures: list[tuple[int, WorkerDiedError]] = []
    while True:
        try:
            return fit()
        except WorkerDiedError as err:
            at = step() + 1
            # Before the cap: a repeat at the last allowed restart must still name both errors.
            if failures and failures[-1][0] == at:
                raise RepeatedFaultError(
                    f"a trainer worker died twice at step {at}; not restarting again.\n"
                    f"first: {failures[-1][1]}\nthen: {err}") from err
            if len(failures) >= max_restarts:
                raise
            failures.append((at, err))
            logger.warning("a trainer worker died during step %d (%s); restarting the worker groups from the "
                           "newest checkpoint (restart %d of trainer.max_restarts=%d)", at, err, len(failures),
                           max_restarts)
            start = time.monotonic()
            restart()
            logger.warning("worker groups started again in %.1f s", time.monotonic() - start)
