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

The same level also keeps the start-up notices of a CPU run off the console (STARTUP_NOTICES: vLLM's CPU build
asking for libtcmalloc/libiomp in LD_PRELOAD and for triton-cpu, the V1 model runner chosen, eager mode and the
in-process engine's seed notice, torch's "Triton not available"; a FutureWarning vLLM's import triggers in torch;
the C++ NUMA-binding notice, through TORCH_CPP_LOG_LEVEL=ERROR; transformers' weight-loading progress bars, through
HF_HUB_DISABLE_PROGRESS_BARS=1) and Ray's token-auth and backend-level notices
(`log_level_env`; the driver installs the filters too). Each says nothing is wrong with the run; `trainer.log_level=INFO`
shows them all again.
"""

from __future__ import annotations

import logging
import os
import warnings

LEVEL_ENV = "VERL_LIKE_LOG_LEVEL"
# (logger name, substring of the message format, substring of one of its arguments or None)
HARMLESS_REPEATS = (
    ("vllm.model_executor.model_loader.reload.layerwise", "Failed to load weights", "RotaryEmbedding"),
    ("vllm.v1.worker.cpu_worker", "torch.set_num_threads", None),
    ("vllm.utils.jit_monitor", "during inference", "token_log_probs"),
)
# Start-up notices that say nothing about the run (logged once per engine start).
STARTUP_NOTICES = (
    ("vllm.v1.worker.cpu_worker", "is not found in LD_PRELOAD", None),
    ("vllm.platforms.cpu", "Triton is not installed", None),
    ("vllm.platforms.cpu", "Reset SSM cache type", None),
    ("vllm.config.vllm", "Model Runner V2 requires Triton", None),
    ("vllm.config.vllm", "Enforce eager set", None),
    ("vllm.config.vllm", "Inductor compilation was disabled", None),
    ("vllm.engine.arg_utils", "global random seed is set", None),
    ("torch._library.triton", "Triton not available", None),
    # A new local cluster turns token auth on (Ray's default) and says so; the driver filters it (trainer/launch.py).
    ("ray._private.authentication.authentication_token_setup", "Token authentication is enabled", None),
)
# (category, message regex) of Python warnings that vLLM's import raises from torch, harmless.
STARTUP_WARNINGS = ((FutureWarning, r"`torch\.distributed\.reduce_op` is deprecated"),)


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


def _quiet(level: str) -> bool:
    return logging.getLevelName(level.upper()) > logging.INFO


def log_level_env(level: str) -> dict[str, str]:
    """Environment for the workers: vLLM's level, torch's C++ level, the level the filters read, and Ray's backend
    level when it is not the default (setting it makes every Ray process print that it was set)."""
    env = {"VLLM_LOGGING_LEVEL": level, LEVEL_ENV: level, "TORCH_CPP_LOG_LEVEL": "ERROR" if _quiet(level) else level}
    if _quiet(level):
        # transformers' "Loading weights" bar in each worker: Ray forwards a bar's carriage-return updates only when
        # a newline follows, so the bar's first frame used to surface after the run's summary, at the workers' exit
        env["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if level.upper() != "WARNING":
        env["RAY_BACKEND_LOG_LEVEL"] = level.lower()
    return env


def install_noise_filters(level: str | None = None) -> None:
    """Demotes HARMLESS_REPEATS and STARTUP_NOTICES (and ignores STARTUP_WARNINGS) when the level (default $VERL_LIKE_LOG_LEVEL, else WARNING) is above INFO."""
    level = (level or os.environ.get(LEVEL_ENV, "WARNING")).upper()
    if not _quiet(level):
        return
    for category, message in STARTUP_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    for name, fragment, arg_fragment in HARMLESS_REPEATS + STARTUP_NOTICES:
        target = logging.getLogger(name)
        if not any(isinstance(f, _Demote) and f.fragment == fragment for f in target.filters):
            target.addFilter(_Demote(fragment, arg_fragment))
