"""Learning-rate factor per optimizer step: linear warmup, then constant or cosine decay."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class WarmupSchedule:
    """Multiplier of the base LR for the optimizer step with index `step` (0 for the first step).

    Warmup: (step + 1) / warmup_steps for step < warmup_steps, so the first step already learns. Then "constant"
    keeps 1; "cosine" goes from 1 at step = warmup_steps to min_lr_ratio at step = total_steps and stays there.
    A dataclass (not a closure) so that LambdaLR's state_dict can save it.
    """

    schedule: str
    warmup_steps: int
    total_steps: int | None = None
    min_lr_ratio: float = 0.0

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.schedule == "constant":
            return 1.0
        if self.schedule == "cosine":
            assert self.total_steps is not None  # EngineConfig validates this
            progress = min(1.0, (step - self.warmup_steps) / (self.total_steps - self.warmup_steps))
            return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
        raise ValueError(f"lr_scheduler={self.schedule!r} is not one of ('constant', 'cosine')")
