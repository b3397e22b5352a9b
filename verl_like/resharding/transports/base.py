"""`WeightTransport`: how a trainer's fresh weights reach its rollout engine, one implementation per file.

- `colocated_sliced.SlicedTransport`: the hybrid engine; each rollout TP rank receives only its slices from the
  trainer ranks holding those rows (one torch.distributed world holds both sides).
- `full.FullTensorTransport`: full tensors through the engine's own loader (the reference path, the fallback for
  unknown layouts, and a user's `update_rollout_weights` hook).
- `server.ServerTransport`: vLLM servers, through vLLM's native weight-transfer API.
- `adapter.AdapterTransport`: a LoRA policy into an in-process engine: the base weights once, then the adapter's
  tensors alone.
- `server_adapter.ServerAdapterTransport`: the same into servers (the base through `server.py`'s round).
`factory.build_transport` picks one, for every placement (the one place).
Every trainer rank calls `send` together (the gathers are collectives).
"""

from __future__ import annotations

import abc

from verl_like.resharding.transfer import SyncStats


class WeightTransport(abc.ABC):
    """Moves the trainer's current weights into the rollout engine(s)."""

    @abc.abstractmethod
    def send(self, version: int) -> SyncStats:
        """Sends the current weights, tagged with policy `version` (the number of actor updates synced into the
        rollout, workers/weight_version.py); this rank's stats."""

    def forget_engine_weights(self) -> None:
        """The engine lost its weights (a sleep that discards them): the next `send` sends everything again."""

    def close(self) -> None:
        """Releases what the transport holds (groups, connections)."""
