"""A progress bar for the training loop: step, reward, tokens/s and ETA."""

from __future__ import annotations

import sys

from tqdm import tqdm


class Progress:
    """tqdm bar over training steps; the postfix shows the headline metrics of the last step."""

    def __init__(self, total: int, start: int = 0) -> None:
        self._bar = tqdm(total=total, initial=start, desc="training", unit="step", file=sys.stderr, dynamic_ncols=True)
        self._val: float | None = None

    def note(self, metrics: dict[str, float]) -> None:
        if "val/score/mean" in metrics:
            self._val = metrics["val/score/mean"]
            self._bar.set_postfix_str(f"val={self._val:.3f}")

    def update(self, step: int, metrics: dict[str, float]) -> None:
        self.note(metrics)
        parts = []
        if "critic/score/mean" in metrics:
            parts.append(f"reward={metrics['critic/score/mean']:.3f}")
        if self._val is not None:
            parts.append(f"val={self._val:.3f}")
        if "perf/throughput" in metrics:
            parts.append(f"tok/s={metrics['perf/throughput']:.0f}")
        self._bar.set_postfix_str(" ".join(parts))
        self._bar.update(step - self._bar.n)

    def close(self) -> None:
        self._bar.close()
