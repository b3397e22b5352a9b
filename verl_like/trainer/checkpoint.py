"""Trainer checkpoints: `global_step_N/` directories written atomically, plus a `latest` pointer.

Layout under `trainer.default_local_dir`:
    global_step_N/actor/        the actor engine's sharded checkpoint (written by the workers)
    global_step_N/critic/       the critic's, when there is one
    global_step_N/trainer.pt    step, dataloader position, KL controller, RNG of the driver
    latest_checkpointed_iteration.txt   N, replaced atomically after global_step_N is complete

A crash at any point leaves the previous complete checkpoint and its pointer untouched.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl_like.utils.checkpoint import commit_directory, prepare_staging

logger = logging.getLogger(__name__)

LATEST_FILE = "latest_checkpointed_iteration.txt"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


def rng_state() -> dict[str, Any]:
    """The driver's Python, numpy and torch RNG states."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


class CheckpointManager:
    """Writes and finds trainer checkpoints under `root`, keeping at most `max_to_keep` (None: all)."""

    def __init__(self, root: str | os.PathLike, max_to_keep: int | None = None) -> None:
        self.root = Path(root)
        self.max_to_keep = max_to_keep

    def step_dir(self, step: int) -> Path:
        return self.root / f"global_step_{step}"

    def begin(self, step: int) -> Path:
        """An empty staging directory for step `step`; workers write their parts under it."""
        self.root.mkdir(parents=True, exist_ok=True)
        return prepare_staging(self.step_dir(step))

    def commit(self, step: int, staging: Path, trainer_state: dict[str, Any]) -> Path:
        """Adds the trainer state, moves the staging directory into place, then points `latest` at it."""
        torch.save(trainer_state, staging / "trainer.pt")
        final = commit_directory(staging, self.step_dir(step))
        pointer_tmp = self.root / f".{LATEST_FILE}.tmp"
        pointer_tmp.write_text(f"{step}\n", encoding="utf-8")
        os.replace(pointer_tmp, self.root / LATEST_FILE)
        self._prune()
        logger.info("checkpoint of step %d saved to %s", step, final)
        return final

    def latest_step(self) -> int | None:
        """The step of the newest complete checkpoint, or None."""
        pointer = self.root / LATEST_FILE
        if not pointer.exists():
            return None
        text = pointer.read_text(encoding="utf-8").strip()
        if not text.isdigit():
            raise ValueError(f"{pointer} holds {text!r}, not a step number; delete it or fix it by hand")
        step = int(text)
        if not (self.step_dir(step) / "trainer.pt").exists():
            raise FileNotFoundError(f"{pointer} points at step {step} but {self.step_dir(step)} is incomplete")
        return step

    def load_trainer_state(self, step: int) -> dict[str, Any]:
        return torch.load(self.step_dir(step) / "trainer.pt", weights_only=False)

    def _prune(self) -> None:
        if not self.max_to_keep:
            return
        steps = sorted(int(m.group(1)) for p in self.root.iterdir() if (m := _STEP_DIR.match(p.name)))
        for step in steps[: -self.max_to_keep]:
            shutil.rmtree(self.step_dir(step), ignore_errors=True)
