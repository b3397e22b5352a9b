"""Trainer checkpoints: `global_step_N/` directories written atomically, plus a `latest` pointer.

Layout under `trainer.default_local_dir`:
    global_step_N/actor/        the actor engine's sharded checkpoint (written by the workers)
    global_step_N/critic/       the critic's, when there is one
    global_step_N/trainer.pt    step, dataloader position, KL controller, RNG of the driver
    latest_checkpointed_iteration.txt   N, replaced atomically after global_step_N is complete

A crash at any point leaves the previous complete checkpoint and its pointer untouched; a save that fails (disk
full, permissions) removes its staging folder and raises CheckpointSaveError naming the intact previous one.
`latest_step` checks the checkpoint it returns (trainer.pt loads, every DCP shard file is as long as the shard's
metadata says, each engine part has its extra_state_rank0.pt) and falls back to the newest good one with a
warning naming the bad one, so a truncated latest checkpoint costs the steps since the previous one, not the run.

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
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import torch

from verl_like.utils.checkpoint import commit_directory, prepare_staging, write_text_atomically

logger = logging.getLogger(__name__)

LATEST_FILE = "latest_checkpointed_iteration.txt"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


class CheckpointSaveError(RuntimeError):
    """Writing a checkpoint failed; the previous checkpoint (if any) is intact."""


def engine_part_problem(part: Path) -> str | None:
    """Why the engine checkpoint folder `part` cannot be loaded, or None when it looks whole.

    A folder without DCP metadata is not an engine checkpoint (custom workers may write anything) and passes.
    """
    if not (part / ".metadata").is_file():
        return None
    if not (part / "extra_state_rank0.pt").is_file():
        return f"{part} has no extra_state_rank0.pt"
    from torch.distributed.checkpoint import FileSystemReader

    try:
        metadata = FileSystemReader(str(part)).read_metadata()
    except Exception as err:  # torch raises several types for a corrupt metadata file
        return f"{part}/.metadata does not load ({type(err).__name__}: {err})"
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(needed.items()):
        file = part / name
        actual = file.stat().st_size if file.is_file() else -1
        if actual < size:
            state = "missing" if actual < 0 else f"{actual} bytes, truncated"
            return f"{file} is {state} (its metadata needs {size} bytes)"
    return None


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
        write_text_atomically(self.root / LATEST_FILE, f"{step}\n")
        self._prune()
        logger.info("checkpoint of step %d saved to %s", step, final)
        return final

    def save(self, step: int, write_parts: Callable[[Path], None], trainer_state: dict[str, Any]) -> Path:
        """begin + `write_parts(staging)` + commit; on failure removes the staging folder and raises
        CheckpointSaveError saying which checkpoint is still the latest."""
        staging = None
        try:
            staging = self.begin(step)
            write_parts(staging)
            return self.commit(step, staging, trainer_state)
        except Exception as err:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
            previous = self._pointed_step()
            kept = f"the previous checkpoint {self.step_dir(previous)} is intact" if previous is not None else (
                "there is no earlier checkpoint")
            raise CheckpointSaveError(
                f"saving the checkpoint of step {step} under {self.root} failed ({type(err).__name__}: {err}); {kept} "
                "and resume_mode=auto resumes from it. Free space or fix permissions under trainer.default_local_dir"
            ) from err

    def _pointed_step(self) -> int | None:
        pointer = self.root / LATEST_FILE
        if not pointer.exists():
            return None
        text = pointer.read_text(encoding="utf-8").strip()
        return int(text) if text.isdigit() else None

    def problem(self, step: int, required_parts: Iterable[str] = ()) -> str | None:
        """Why the checkpoint of `step` cannot be resumed from, or None when it looks whole."""
        directory = self.step_dir(step)
        try:
            self.load_trainer_state(step)
        except FileNotFoundError:
            return f"{directory} is incomplete (no trainer.pt)"
        except Exception as err:  # truncated or corrupt pickle
            return f"{directory}/trainer.pt does not load ({type(err).__name__}: {err})"
        for part in required_parts:
            if not (directory / part).is_dir():
                return f"{directory} has no {part} folder"
        for part in sorted(p for p in directory.iterdir() if p.is_dir()):
            if (reason := engine_part_problem(part)) is not None:
                return reason
        return None

    def latest_step(self, required_parts: Iterable[str] = ()) -> int | None:
        """The step of the newest good checkpoint (see the module doc), or None when there is no checkpoint.

        Falls back from the `latest` pointer to older step folders with a warning; raises FileNotFoundError when
        the pointer exists but no checkpoint is good. required_parts: part folders a good checkpoint must hold.
        """
        pointer = self.root / LATEST_FILE
        if not pointer.exists():
            return None
        required = tuple(required_parts)
        text = pointer.read_text(encoding="utf-8").strip()
        pointed = int(text) if text.isdigit() else None
        problems = [] if pointed is not None else [f"{pointer} holds {text!r}, not a step number"]
        candidates = ([pointed] if pointed is not None else []) + [
            step for step in reversed(self.steps()) if pointed is None or step < pointed
        ]
        for step in candidates:
            reason = self.problem(step, required) if self.step_dir(step).is_dir() else (
                f"{pointer} points at step {step} but {self.step_dir(step)} is incomplete (missing)")
            if reason is None:
                if problems:
                    logger.warning(
                        "latest checkpoint is unusable (%s); resuming from the previous good one, %s",
                        "; ".join(problems), self.step_dir(step),
                    )
                return step
            problems.append(reason if step != pointed else f"{pointer} points at step {step} but {reason}")
        raise FileNotFoundError(
            f"no usable checkpoint under {self.root}: {'; '.join(problems)}; delete the bad folders to start "
            "fresh, or set trainer.resume_mode=disable"
        )

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
