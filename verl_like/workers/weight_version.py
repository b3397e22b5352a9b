"""`WeightVersion`: the one meaning of a policy's version, counted where the weights leave the actor.

A version is the number of actor updates synced into the rollout: 0 is the initial weights, and each sync of
weights the actor changed since the last sync is the next version, however many optimizer steps (mini-batches ×
epochs) the update took. A sync of the same weights again (a relinked server, a reload after a sleep that discarded
them, a second sync without an update) keeps the version. The transports tag the weights with it (the servers'
`weight_version`), `weight_sync/version` reports it, and the driver's prefetcher, metrics and rollout dumps read it
from there (trainer/rollout_handle.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class WeightVersion:
    """The version the rollout holds (`number`) and the actor optimizer step whose weights it names
    (`actor_step`; None before the first sync)."""

    number: int = 0
    actor_step: int | None = None

    def of_sync(self, actor_step: int) -> int:
        """The version a sync of the actor's weights at optimizer step `actor_step` sends (module doc)."""
        if self.actor_step is None or self.actor_step == actor_step:
            return self.number
        return self.number + 1

    def synced(self, actor_step: int, number: int) -> None:
        """Records a finished sync of the weights at `actor_step` as version `number` (a failed one records nothing,
        so the next sync of those weights still counts as new)."""
        self.actor_step, self.number = actor_step, number
