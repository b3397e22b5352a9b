"""The lines a finished run ends with: held-out reward before → after, steps and time, where metrics, TensorBoard,
W&B and checkpoints are, and the report and export commands (`launch` logs them after the workers are released,
so they come after Ray's deferred worker messages)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from verl_like.utils.tracking import MEMORY_METRICS

VAL_KEY = "val/score/mean"
# The actor's workers' memory per step (utils/device.peak_memory_metrics), in the summary's order
MEMORY_KEYS = tuple(f"perf/{name}" for name in MEMORY_METRICS)


@dataclass
class RunRecord:
    """What `PPOTrainer.fit` saw: the first and last step it ran, the held-out rewards by step, its wall time."""

    first_step: int = 0
    last_step: int = 0
    val_scores: list[tuple[int, float]] = field(default_factory=list)
    seconds: float = 0.0
    peak_memory_gb: dict[str, float] = field(default_factory=dict)  # MEMORY_KEYS: the largest any step logged

    def note_validation(self, step: int, metrics: dict[str, float]) -> None:
        if VAL_KEY in metrics:
            self.val_scores.append((step, float(metrics[VAL_KEY])))

    def note_memory(self, metrics: dict[str, float]) -> None:
        for key in MEMORY_KEYS:
            if isinstance(metrics.get(key), (int, float)):
                self.peak_memory_gb[key] = max(self.peak_memory_gb.get(key, 0.0), float(metrics[key]))


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def format_summary(record: RunRecord, run_dir: Path, loggers: tuple[str, ...], save_freq: int) -> str:
    """The end-of-run summary of `record` for a run writing to `run_dir`."""
    steps = record.last_step - record.first_step
    lines = [f"run finished: {steps} step(s) (step {record.first_step} -> {record.last_step}) in "
             f"{_duration(record.seconds)}"]
    if len(record.val_scores) >= 2:
        (s0, v0), (s1, v1) = record.val_scores[0], record.val_scores[-1]
        lines.append(f"held-out reward ({VAL_KEY}): {v0:.3f} at step {s0} -> {v1:.3f} at step {s1}")
    elif record.val_scores:
        step, value = record.val_scores[0]
        lines.append(f"held-out reward ({VAL_KEY}): {value:.3f} at step {step} (validated once)")
    else:
        lines.append("held-out reward: not measured (trainer.test_freq / trainer.val_before_train / data.val_files)")
    allocated, reserved, host = (record.peak_memory_gb.get(key) for key in MEMORY_KEYS)
    parts = []
    if allocated is not None and reserved is not None:
        parts.append(f"device {allocated:.1f} GiB allocated, {reserved:.1f} GiB reserved (torch's allocator)")
    if host is not None:
        parts.append(f"host {host:.1f} GiB resident")
    if parts:
        lines.append("peak memory of an actor worker: " + "; ".join(parts))
    if "jsonl" in loggers:
        lines.append(f"metrics: {run_dir / 'metrics.jsonl'}")
    if "tensorboard" in loggers:
        lines.append(f"TensorBoard: tensorboard --logdir {run_dir / 'tensorboard'}")
    if "wandb" in loggers:
        lines.append(f"W&B: {run_dir / 'wandb'} (offline runs: wandb sync {run_dir / 'wandb'}/offline-run-*)")
    checkpoints = sorted((run_dir / "checkpoints").glob("global_step_*"), key=lambda p: int(p.name.rpartition("_")[2]))
    if checkpoints:
        newest = checkpoints[-1]
        lines.append(f"checkpoints: {run_dir / 'checkpoints'} (newest {newest.name}); export to HF format: "
                     f"python -m verl_like.model_merger --local_dir {newest / 'actor'} --target_dir OUT")
    else:
        lines.append(f"checkpoints: none saved (trainer.save_freq={save_freq})")
    if "jsonl" in loggers:
        lines.append(f"report: python -m verl_like.report {run_dir}")
    return "\n".join(lines)
