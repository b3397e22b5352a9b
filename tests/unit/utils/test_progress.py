"""A start-up phase that runs long says so while it runs, and how long it took; a short one stays quiet (issue #31:
the worker start ran 2.5 min with no output)."""

from __future__ import annotations

import logging
import time

import pytest

from verl_like.utils.progress import phase


def test_a_long_phase_reports_while_it_runs_and_when_it_ends(caplog):
    with caplog.at_level(logging.INFO, logger="verl_like.utils.progress"):
        with phase("starting 2 trainer worker process(es)", every_s=0.05):
            time.sleep(0.23)
    lines = [r.getMessage() for r in caplog.records]
    still = [line for line in lines if line.startswith("starting 2 trainer worker process(es): still running (")]
    assert len(still) >= 3, lines
    assert lines[-1].startswith("starting 2 trainer worker process(es): done in "), lines


def test_a_short_phase_logs_nothing_and_errors_pass_through(caplog):
    with caplog.at_level(logging.INFO, logger="verl_like.utils.progress"):
        with phase("quick", every_s=5.0):
            pass
        with pytest.raises(RuntimeError, match="boom"), phase("failing", every_s=5.0):
            raise RuntimeError("boom")
    assert caplog.records == []
