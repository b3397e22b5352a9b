"""Trainer checkpoints: `global_step_N/` directories written atomically, plus a `latest` pointer.

Layout under `trainer.default_local_dir`:
    global_step_N/actor/        the actor engine's sharded checkpoint (written by the workers)
    global_step_N/critic/       the critic's, when there is one
    global_step_N/trainer.pt    step, dataloader position, KL controller, RNG of the driver
    latest_checkpointed_iteration.txt   N, replaced atomically after global_step_N is complete

A crash at any point leaves the previous complete checkpoint and its pointer untouched.

Rotation: `max_to_keep` bounds whole step folders; `part_limits` bounds each part on its own
(trainer.max_actor_ckpt_to_keep / max_critic_ckpt_to_keep): `global_step_N/<part>/` is removed from all but the
newest `limit` step folders that hold it, and a step folder whose parts are all gone is removed with its
trainer.pt. The newest checkpoint always keeps every part (limits are >= 1), so `resume_mode=auto` can resume.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any, Mapping

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
    """Writes and finds trainer checkpoints under `root`.

    max_to_keep: newest step folders kept (None: all). part_limits: per part folder ("actor", "critic"), the
    newest step folders that keep it (None: all); see the module doc.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        max_to_keep: int | None = None,
        part_limits: Mapping[str, int | None] | None = None,
    ) -> None:
        self.root = Path(root)
        self.max_to_keep = max_to_keep
        self.part_limits = dict(part_limits or {})
        for part, limit in self.part_limits.items():
            if limit is not None and limit < 1:
                raise ValueError(f"CheckpointManager: part_limits[{part!r}]={limit} must be >= 1 or None")

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

    def steps(self) -> list[int]:
        """Steps of the step folders under root, ascending."""
        if not self.root.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.root.iterdir() if (m := _STEP_DIR.match(p.name)))

    def _prune(self) -> None:
        steps = self.steps()
        if self.max_to_keep:
            for step in steps[: -self.max_to_keep]:
                shutil.rmtree(self.step_dir(step), ignore_errors=True)
            steps = steps[-self.max_to_keep :]
        touched: set[int] = set()
        for part, limit in self.part_limits.items():
            if limit is None:
                continue
            holding = [step for step in steps if (self.step_dir(step) / part).is_dir()]
            for step in holding[:-limit]:
                shutil.rmtree(self.step_dir(step) / part, ignore_errors=True)
                touched.add(step)
        for step in sorted(touched):
            if not any((self.step_dir(step) / part).is_dir() for part in self.part_limits):
                shutil.rmtree(self.step_dir(step), ignore_errors=True)
