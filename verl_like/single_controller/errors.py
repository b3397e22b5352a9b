"""Errors a group call raises on the driver; each names the group, role, method and rank."""

from __future__ import annotations


class WorkerGroupError(RuntimeError):
    """Base of the errors below."""


class WorkerError(WorkerGroupError):
    """A worker method raised; carries the remote traceback."""

    def __init__(self, where: str, rank: int, remote_traceback: str):
        self.where = where
        self.rank = rank
        self.remote_traceback = remote_traceback
        super().__init__(f"{where} failed on rank {rank}:\n{remote_traceback}")


class WorkerDiedError(WorkerGroupError):
    """The Ray actor of a worker died (crash, OOM kill, node loss)."""

    def __init__(self, where: str, rank: int, reason: str):
        self.where = where
        self.rank = rank
        super().__init__(f"{where}: the actor of rank {rank} died: {reason}")


class WorkerTimeoutError(WorkerGroupError, TimeoutError):
    """Some ranks did not finish a call within its timeout."""

    def __init__(self, where: str, pending_ranks: list[int], timeout_s: float, how: str | None = None):
        self.where = where
        self.pending_ranks = pending_ranks
        self.timeout_s = timeout_s
        chosen = (
            f"; the timeout was the group default ({how}): raise trainer.timeouts.call_timeout_factor / "
            "min_call_timeout_s / first_call_timeout_s, or fix it with trainer.timeouts.worker_call_timeout_s"
            if how else "; raise the timeout with the method's timeout_s= or the group's default_timeout_s"
        )
        super().__init__(
            f"{where}: ranks {pending_ranks} did not finish within {timeout_s:g} s "
            "(a rank stuck in a collective usually means another rank failed or never joined)"
            f"{chosen} if the work is just slow"
        )


class ResourceUnavailableError(WorkerGroupError):
    """The cluster cannot place a resource pool."""
