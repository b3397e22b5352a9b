"""AsyncTrainingConfig: generation overlapping the update (`async_training`), server mode."""

from __future__ import annotations

from dataclasses import dataclass

from verl_like.config.errors import ConfigError

_P = "async_training"


@dataclass(frozen=True)
class AsyncTrainingConfig:
    """Bounded-staleness training: the batch of step t+1 is generated while step t trains.

      enable: run the loop through the asynchronous driver (trainer/async_rollout.py). Needs
        actor_rollout_ref.rollout.mode=server: the servers generate while the trainer's workers update.
      staleness: K, the most policy versions a trained sample may lag: 0 = on-policy (the asynchronous driver then
        reproduces the synchronous loop exactly), 1 = one-step off-policy (the batch of step t+1 is generated, with
        the weights step t trains from, while step t trains), K > 1 prefetches up to K batches. Every batch records the weight version
        it was generated with (`async/weight_version`) and its lag (`async/staleness`).
        The off-policy gap is corrected by the rollout's own log-probs through algorithm.rollout_is (truncated
        importance weights old/rollout per token; turn it on for staleness > 0, see docs/algorithms.md).
      partial_rollout: a weight update does not wait for in-flight generation: requests are frozen
        (vLLM's pause mode "keep"), continue on the new weights after the update, and count as generated with the
        version they started on.
    """

    enable: bool = False
    staleness: int = 0
    partial_rollout: bool = False

    def __post_init__(self) -> None:
        if self.staleness < 0:
            raise ConfigError(f"{_P}.staleness={self.staleness} must be >= 0 (0 = on-policy)")
        if not self.enable and (self.staleness or self.partial_rollout):
            raise ConfigError(
                f"{_P}.staleness={self.staleness} / {_P}.partial_rollout={self.partial_rollout} take effect only "
                f"with {_P}.enable=true; set it"
            )
        if self.partial_rollout and self.staleness < 1:
            raise ConfigError(f"{_P}.partial_rollout=true needs {_P}.staleness >= 1 (samples span two versions)")
