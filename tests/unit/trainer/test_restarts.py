"""fit_with_restarts' decisions on a stand-in trainer (pure logic; the real restart is in
tests/integration/trainer/test_main_ppo.py)."""

from __future__ import annotations

import pytest

from verl_like.single_controller.errors import WorkerDiedError, WorkerError
from verl_like.trainer.restarts import RepeatedFaultError, fit_with_restarts


class Trainer:
    """fit() dies at the steps in `deaths` (one death each), else finishes at `total`; a restart resumes at
    `checkpoint`."""

    def __init__(self, deaths: list[int], checkpoint: int = 2, total: int = 6) -> None:
        self.deaths, self.checkpoint, self.total = list(deaths), checkpoint, total
        self.step, self.restarts = 0, 0

    def fit(self) -> dict[str, float]:
        while self.step < self.total:
            if self.deaths and self.deaths[0] == self.step + 1:
                self.deaths.pop(0)
                raise WorkerDiedError("hybrid.actor_rollout.update_actor", 1, f"killed in step {self.step + 1}")
            self.step += 1
        return {"step": float(self.step)}

    def restart(self) -> None:
        self.restarts += 1
        self.step = self.checkpoint


def run(trainer: Trainer, max_restarts: int) -> dict[str, float]:
    return fit_with_restarts(trainer.fit, trainer.restart, lambda: trainer.step, max_restarts)


def test_a_death_restarts_from_the_checkpoint_and_the_run_finishes():
    trainer = Trainer(deaths=[4])
    assert run(trainer, max_restarts=1) == {"step": 6.0}
    assert trainer.restarts == 1


def test_no_restart_by_default():
    with pytest.raises(WorkerDiedError, match="killed in step 4"):
        run(Trainer(deaths=[4]), max_restarts=0)


def test_restarts_are_capped():
    trainer = Trainer(deaths=[3, 4, 5])
    with pytest.raises(WorkerDiedError, match="killed in step 5"):
        run(trainer, max_restarts=2)
    assert trainer.restarts == 2


def test_the_same_fault_twice_at_one_step_ends_the_run_naming_both():
    trainer = Trainer(deaths=[4, 4])
    with pytest.raises(RepeatedFaultError, match=r"(?s)died twice at step 4.*first: .*killed in step 4.*then: "
                                                  r".*killed in step 4"):
        run(trainer, max_restarts=3)
    assert trainer.restarts == 1


def test_the_same_fault_twice_names_both_also_when_it_uses_the_last_restart():
    """trainer.max_restarts=1, the issue's setting: the second death is past the cap and at the same step."""
    trainer = Trainer(deaths=[4, 4])
    with pytest.raises(RepeatedFaultError, match=r"(?s)died twice at step 4.*first: .*then: "):
        run(trainer, max_restarts=1)
    assert trainer.restarts == 1


def test_other_errors_are_not_restarted():
    def fit():
        raise WorkerError("hybrid.actor_rollout.update_actor", 0, "ValueError: bad batch")

    with pytest.raises(WorkerError):
        fit_with_restarts(fit, lambda: None, lambda: 0, 3)
