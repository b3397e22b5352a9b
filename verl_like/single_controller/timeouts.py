"""Default timeouts of worker-group calls that follow the work's size instead of one hour for everything.

A call with no timeout of its own (no `timeout_s=` argument, none in its `@register`) gets:
  fixed_s, when set (trainer.timeouts.worker_call_timeout_s);
  else first_call_s for the first call of that role's method (compilation, cache warm-up, first allocation);
  else max(min_s, factor x the slowest earlier call of the same method).
So a 2-second generation that stalls fails after min_s (120 s by default), not after an hour, while a method that
really takes 20 minutes gets 200. Work that grows by more than `factor` within a run (a validation batch far
larger than the training batch) needs a larger factor or a fixed timeout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from verl_like.config.trainer import TimeoutsConfig


@dataclass
class CallTimeouts:
    """Timeouts per method key ("group.role.method"); see the module doc."""

    fixed_s: float | None = None
    first_call_s: float = 900.0
    factor: float = 10.0
    min_s: float = 120.0
    _slowest: dict[str, float] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for name in ("first_call_s", "factor", "min_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"CallTimeouts.{name}={getattr(self, name)} must be > 0")
        if self.fixed_s is not None and not self.fixed_s > 0:
            raise ValueError(f"CallTimeouts.fixed_s={self.fixed_s} must be > 0, or None (adaptive)")

    @classmethod
    def from_config(cls, timeouts: TimeoutsConfig) -> CallTimeouts:
        """The worker groups' default call timeouts of the `trainer.timeouts` node."""
        return cls(
            fixed_s=timeouts.worker_call_timeout_s,
            first_call_s=timeouts.first_call_timeout_s,
            factor=timeouts.call_timeout_factor,
            min_s=timeouts.min_call_timeout_s,
        )

    def timeout_for(self, key: str) -> float:
        """Seconds the next call of `key` may take."""
        if self.fixed_s is not None:
            return self.fixed_s
        slowest = self._slowest.get(key)
        return self.first_call_s if slowest is None else max(self.min_s, self.factor * slowest)

    def record(self, key: str, seconds: float) -> None:
        """Notes that a call of `key` finished after `seconds`."""
        self._slowest[key] = max(seconds, self._slowest.get(key, 0.0))

    def describe(self, key: str) -> str:
        """How the timeout of `key` was chosen, for error messages."""
        if self.fixed_s is not None:
            return f"fixed default {self.fixed_s:g} s"
        slowest = self._slowest.get(key)
        if slowest is None:
            return f"first call of the method: {self.first_call_s:g} s"
        return f"{self.factor:g} x its slowest earlier call ({slowest:.1f} s), at least {self.min_s:g} s"
