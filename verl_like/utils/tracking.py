"""Metrics sinks: console, JSONL and TensorBoard always available; W&B and MLflow when configured."""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Protocol

from verl_like.config.names import LOGGER_BACKENDS

logger = logging.getLogger(__name__)

# A worker's memory per step, the names after its prefix ("perf", "perf/critic"): utils/device.peak_memory_metrics
# writes them; the run summary, the report and the max-over-workers reduction read them.
MEMORY_METRICS = ("max_memory_allocated_gb", "max_memory_reserved_gb", "cpu_memory_used_gb")


class _Sink(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class _ConsoleSink:
    """One line per step with the headline metrics; the full dict at DEBUG level."""

    HEADLINE = ("critic/score/mean", "val/score/mean", "response_length/mean", "actor/kl_loss", "perf/throughput", "timing_s/step")

    def log(self, metrics: dict[str, float], step: int) -> None:
        shown = [f"{k}={metrics[k]:.4g}" for k in self.HEADLINE if k in metrics]
        logger.info("step %d: %s", step, "  ".join(shown) if shown else f"{len(metrics)} metrics")
        logger.debug("step %d metrics: %s", step, metrics)

    def close(self) -> None:
        pass


class _JsonlSink:
    """Appends {"step": s, **metrics} per line; flushed every step so a crash loses nothing logged."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("a", encoding="utf-8")

    def log(self, metrics: dict[str, float], step: int) -> None:
        record = {"step": step, **{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class _TensorBoardSink:
    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def wandb_mode(environ: dict[str, str] | None = None, netrc_path: Path | None = None) -> str:
    """"online" when W&B credentials are at hand (WANDB_API_KEY, or an api.wandb.ai entry in ~/.netrc, what
    `wandb login` writes), else "offline"; WANDB_MODE, when set, decides."""
    import netrc

    environ = os.environ if environ is None else environ
    if environ.get("WANDB_MODE"):
        return environ["WANDB_MODE"]
    if environ.get("WANDB_API_KEY"):
        return "online"
    try:
        entries = netrc.netrc(str(netrc_path or Path.home() / ".netrc")).hosts
    except (OSError, netrc.NetrcParseError):
        entries = {}
    return "online" if any("wandb" in host for host in entries) else "offline"


class _WandbSink:
    """A W&B run; without credentials an offline one under `log_dir`/wandb (`wandb sync` uploads it later)."""

    def __init__(self, project: str, experiment: str, config: dict[str, Any], log_dir: Path) -> None:
        import wandb

        mode = wandb_mode()
        log_dir.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(project=project, name=experiment, config=config, mode=mode, dir=str(log_dir))
        self.run_dir = Path(self._run.dir).parent  # .../wandb/<offline-|>run-<time>-<id>
        if mode == "offline":
            logger.warning("W&B: no credentials (WANDB_API_KEY or `wandb login`), so the run is logged offline in "
                           "%s; upload it later with `wandb sync %s`", self.run_dir, self.run_dir)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._run.log(metrics, step=step)

    def close(self) -> None:
        self._run.finish()


class _MlflowSink:
    def __init__(self, experiment: str, config: dict[str, Any]) -> None:
        import mlflow

        self._mlflow = mlflow
        mlflow.set_experiment(experiment)
        mlflow.start_run()
        mlflow.log_params({k: str(v)[:250] for k, v in _flatten(config).items()})

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._mlflow.log_metrics({k.replace("@", "_at_"): v for k, v in metrics.items()}, step=step)

    def close(self) -> None:
        self._mlflow.end_run()


class Tracking:
    """Fans one metrics dict per step out to the configured backends."""

    def __init__(
        self,
        backends: list[str],
        log_dir: str | os.PathLike,
        project: str = "verl_like",
        experiment: str = "run",
        config: dict[str, Any] | None = None,
    ) -> None:
        unknown = [b for b in backends if b not in LOGGER_BACKENDS]
        if unknown:
            raise ValueError(f"trainer.logger has unknown backends {unknown}; supported: {list(LOGGER_BACKENDS)}")
        self.log_dir = Path(log_dir)
        self.metrics_path = self.log_dir / "metrics.jsonl"
        self._sinks: list[_Sink] = []
        for backend in backends:
            if backend == "console":
                self._sinks.append(_ConsoleSink())
            elif backend == "jsonl":
                self._sinks.append(_JsonlSink(self.metrics_path))
            elif backend == "tensorboard":
                self._sinks.append(_TensorBoardSink(self.log_dir / "tensorboard"))
            elif backend == "wandb":
                self._sinks.append(_WandbSink(project, experiment, config or {}, self.log_dir))
            elif backend == "mlflow":
                self._sinks.append(_MlflowSink(f"{project}/{experiment}", config or {}))

    def log(self, metrics: dict[str, Any], step: int) -> None:
        scalars = {k: float(v) for k, v in metrics.items() if _is_scalar(v)}
        for sink in self._sinks:
            sink.log(scalars, step)

    def close(self) -> None:
        for sink in self._sinks:
            sink.close()
        self._sinks = []


def _is_scalar(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    return hasattr(value, "item") and getattr(value, "ndim", 1) == 0


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            flat.update(_flatten(value, name))
        else:
            flat[name] = value
    return flat


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl file, in order (a torn last line from a crash is skipped)."""
    records = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            logger.warning("skipping a torn line in %s", path)
    return records
