"""Keeps vLLM's and Ray's per-step noise out of a run's log (trainer.log_level raises it again).

Two parts:
- `log_level_env(level)`: the environment that sets vLLM's logger level in every worker (VLLM_LOGGING_LEVEL) and
  Ray's backend log level, so their INFO lines (e.g. "Successfully reset prefix cache" after every weight sync)
  stay out at the default WARNING;
- `install_noise_filters(level)`: below INFO, demotes to DEBUG the warnings vLLM repeats every step although
  nothing is wrong: "RotaryEmbedding: Failed to load weights" on every weight reload (the layer holds a computed
  cos/sin cache and no checkpoint weights, so there is nothing to load; vLLM keeps its cache), the CPU
  backend's "doesn't allow to use `torch.set_num_threads`" on every generate, and vLLM's JIT monitor calling the
  first compile of our training kernels (engine/token_log_probs.py) a "latency spike during inference". Called in
  every worker process.
"""

from __future__ import annotations

import logging
import os

LEVEL_ENV = "VERL_LIKE_LOG_LEVEL"
# (logger name, substring of the message format, substring of one of its arguments or None)
HARMLESS_REPEATS = (
    ("vllm.model_executor.model_loader.reload.layerwise", "Failed to load weights", "RotaryEmbedding"),
    ("vllm.v1.worker.cpu_worker", "torch.set_num_threads", None),
    ("vllm.utils.jit_monitor", "during inference", "token_log_probs"),
)


class _Demote(logging.Filter):
    """Turns matching WARNING records into DEBUG ones (dropped unless the logger shows DEBUG)."""

    def __init__(self, fragment: str, arg_fragment: str | None) -> None:
        super().__init__()
        self.fragment = fragment
        self.arg_fragment = arg_fragment

    def filter(self, record: logging.LogRecord) -> bool:
        if self.fragment not in str(record.msg):
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        if self.arg_fragment is not None and not any(self.arg_fragment in str(arg) for arg in args):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def log_level_env(level: str) -> dict[str, str]:
    """Environment for the workers: vLLM's level, Ray's backend level, and the level the filters read."""
    return {"VLLM_LOGGING_LEVEL": level, "RAY_BACKEND_LOG_LEVEL": level.lower(), LEVEL_ENV: level}


def install_noise_filters(level: str | None = None) -> None:
    """Demotes HARMLESS_REPEATS when the level (default $VERL_LIKE_LOG_LEVEL, else WARNING) is above INFO."""
    level = (level or os.environ.get(LEVEL_ENV, "WARNING")).upper()
    if logging.getLevelName(level) <= logging.INFO:
        return
    for name, fragment, arg_fragment in HARMLESS_REPEATS:
        target = logging.getLogger(name)
        if not any(isinstance(f, _Demote) and f.fragment == fragment for f in target.filters):
            target.addFilter(_Demote(fragment, arg_fragment))
