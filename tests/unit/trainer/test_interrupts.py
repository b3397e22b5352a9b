"""StopRequests: SIGTERM / SIGINT ask the loop to stop after the step; a second one abandons it."""

import os
import signal

import pytest

from verl_like.trainer.interrupts import StopRequests, TrainingInterrupted


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_first_signal_is_recorded_and_the_second_abandons(signum):
    before = signal.getsignal(signum)
    with StopRequests() as stops:
        os.kill(os.getpid(), signum)
        assert stops.requested == signum  # the process is still here
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signum)
    assert signal.getsignal(signum) is before


def test_interrupted_error_names_the_signal_step_and_checkpoint():
    err = TrainingInterrupted(signal.SIGTERM, 3, "/run/checkpoints/global_step_3")
    assert str(err) == "stopped by SIGTERM after step 3; checkpoint /run/checkpoints/global_step_3 written"
    assert err.exit_code == 143 and TrainingInterrupted(signal.SIGINT, 0, None).exit_code == 130
    assert "no checkpoint (trainer.save_freq=-1, or step 0)" in str(TrainingInterrupted(signal.SIGINT, 0, None))
