"""`TrainRequest`: what the log-prob and update calls on a rollout batch need beyond its tensors, read once.

The rollout writes the temperature it sampled at, the asynchronous driver the learning-rate factor and the policy
version of a prefetched batch; they travel in `batch.meta_info` under the keys a user's worker has always read
("temperature", "lr_scale", "weight_version"). The worker (and `PPOActor` / `ReferencePolicy` called directly) parse
them with `from_meta_info` and pass typed values on, so no layer below handles the string keys.

    batch.meta_info.update(TrainRequest(lr_scale=0.5, weight_version=3).to_meta_info())
    request = TrainRequest.from_meta_info(batch.meta_info)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

# meta_info key of the RolloutISConfig the driver sends when the update computes the rollout IS weights from its own
# forward (the batch has no old log-probs: config/old_log_prob.py).
ROLLOUT_IS_KEY = "rollout_is"

@dataclasses.dataclass(frozen=True)
class TrainRequest:
    """A rollout batch's settings for the calls that train on it.

    temperature: the rollout's sampling temperature, at which log-probs are taken (meta_info "temperature"); None
      when the batch does not say (the worker falls back to rollout.temperature; a direct update raises).
    lr_scale: the factor on the actor's learning rate for this update (meta_info "lr_scale"; the asynchronous
      driver's staleness scaling).
    weight_version: the policy version that generated the batch (meta_info "weight_version",
      workers/weight_version.py); None: the current one (a synchronous rollout).
    """

    temperature: float | None = None
    lr_scale: float = 1.0
    weight_version: int | None = None

    @classmethod
    def from_meta_info(cls, meta_info: Mapping[str, Any]) -> TrainRequest:
        """The request a batch carries (absent keys: the defaults)."""
        temperature, version = meta_info.get("temperature"), meta_info.get("weight_version")
        return cls(
            temperature=None if temperature is None else float(temperature),
            lr_scale=float(meta_info.get("lr_scale", 1.0)),
            weight_version=None if version is None else int(version),
        )

    def to_meta_info(self) -> dict[str, Any]:
        """The meta_info keys of this request; unset fields and lr_scale 1 are left out."""
        meta: dict[str, Any] = {}
        if self.temperature is not None:
            meta["temperature"] = self.temperature
        if self.lr_scale != 1.0:
            meta["lr_scale"] = self.lr_scale
        if self.weight_version is not None:
            meta["weight_version"] = self.weight_version
        return meta
